"""The model of a pod's run: resolve and stage it (hub, staging), check its parallel layout
(strategies, preflight), load it with the job's options (pipeline, options, tiny), call it (pipeline,
inputs) and check its parallel layout renders right (canary)."""
