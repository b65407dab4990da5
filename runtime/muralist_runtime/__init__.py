"""Muralist's in-pod runtime: runs one DiffusionJob's share of images with diffusers.

Its folders are the stages of a pod's run, in the order a rank enters them: plan/, world/, outputs/,
work/, report/, model/ and render/; main.py runs them in turn (run_state.py holds what they hand
on), and launch.py, agent.py and local.py are the entry points. Beside the stages: step_cache/ (the
step cache, which the model, the claim loop and the merge use) and testing/ (failure injection).
An import-linter layers contract (pyproject.toml) keeps every import pointing down, from the entry
points to the stages that have the least to know.

Importing any module of it must stay cheap and torch-free: the launch entry point, the launcher
agent and `muralist run` import them and render nothing themselves. So torch, diffusers,
transformers, numpy, PIL, pyarrow, av and the hub client are imported inside the functions that
use them; the package's own modules are imported at the top.
"""
