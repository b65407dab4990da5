"""The model of a pod's run, one module for each thing done with it: resolve the name a job gives
(resolve; a built-in tiny model built, or the trained one read from the package: tiny, bundled, shapes;
the hub's refusals classified: hub), read its sizes without loading it (sizes), check its parallel
layout (strategies, preflight), load it once the world exists (loading: staged by staging,
`from_pretrained`, the job's features applied by features: adapters, scheduler, the step cache; VAE
tiling; what diffusers looks up at every call found once: settled, and a prompt's encoding kept for its next
item: prompt_memo), compile it (compiling: torch.compile, a
graph per size, warmed up; precompiled: a function per call signature that a new process loads; compile_cache:
what was compiled, kept with the model cache or in a bucket for the next pod), call it (call: what it takes, a
batch's kwargs, its outputs checked; inputs: the items' input images decoded), resume a call from its denoising
state and say when that state is saved (denoising, checkpointing: runPolicy.checkpoint) and check that its
parallel layout renders right (canary)."""
