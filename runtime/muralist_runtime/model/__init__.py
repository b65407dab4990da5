"""The model of a pod's run: resolve and stage it (pipeline, hub, staging; a built-in tiny one built or read
from the package: tiny, bundled, shapes), check its parallel layout (strategies, preflight), load it with
the job's features (loading, pipeline, features: adapters, scheduler, the step cache), call it (pipeline,
inputs) and check its parallel layout renders right (canary)."""
