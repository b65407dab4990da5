"""The planner: `strategy: Auto` and `muralist plan` choose a parallel layout the way diffusers' guide does.

Pure and torch-free, so the operator, the CLI and the runtime plan with the same functions:

- `facts`: what a model is made of, from its safetensors headers and config files alone (a local folder
  here; the hub's ranged reads are the runtime's model/sizes.py, handed the same reader functions);
- `known`: the figures of the public models the docs use and of the built-in tiny models, for the
  operator, which reads no model's files;
- `device`: the devices a plan is made for (given, or from GPU feature discovery's node labels);
- `memory`: the estimate per device (weights, activations at the job's sequence length, the VAE decode);
- `table`: the decision table itself (`decide`, `plan_job`) and the spec a plan resolves to (`planned`);
- `confirm`: what a pod's measurements must confirm of a plan (`confirm_problems`), and the estimate of
  any job's layout (`layout_estimate`);
- `record`: a plan as status, the runtime spec and the job file carry it (`ParallelPlan`).
"""
