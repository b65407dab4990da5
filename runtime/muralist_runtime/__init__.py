"""Muralist's in-pod runtime: runs one DiffusionJob's share of images with diffusers.

Its folders are the stages of a pod's run: world/, model/, work/, render/ and outputs/, with
report/ and testing/ beside them; main.py runs them in turn, and launch.py, agent.py and
local.py are the entry points. An import-linter layers contract (pyproject.toml) keeps every
import pointing down that list.

Importing any module of it must stay cheap and torch-free: the launch entry point, the launcher
agent and `muralist run` import them and render nothing themselves. So torch, diffusers,
transformers, numpy, PIL, pyarrow, av and the hub client are imported inside the functions that
use them; the package's own modules are imported at the top.
"""
