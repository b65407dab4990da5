"""`muralist validate` and `muralist render`: report problems, print objects.

Files are read by the one manifest reader (`muralist_api.manifests`), which `muralist
run` uses too. Errors are reported as `FILE#doc (name): field: problem and fix`, never as a
traceback.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from muralist_api.job import DiffusionJob
from muralist_api.manifests import Reader
from muralist_api.planner.table import CannotPlan

from muralist_operator import planning
from muralist_operator.render import RenderError, render_children
from muralist_operator.settings import OperatorSettings


def summary_line(job: DiffusionJob) -> str:
    par = job.spec.parallelism
    total = job.total_images
    per = job.spec.generation.images_per_prompt
    if total is not None:
        images = f"{total} images"
    elif job.spec.dataset is not None:
        images = f"{per} per row of dataset {job.spec.dataset.path}"
    else:
        images = f"{per} per prompt from configmap/{job.spec.prompts_from.config_map_key_ref.name}"  # type: ignore[union-attr]
    return (
        f"{job.metadata.name}: valid ({par.strategy}, world size {par.world_size}, "
        f"data-parallel degree {par.data_parallel_degree}, {images})"
    )


def validate_files(files: list[str]) -> int:
    """Print one line per valid job to stdout and every problem to stderr; 1 if any."""
    reader = Reader(sys.stderr, sys.stdin)
    for job, _file in reader.jobs(files):
        sys.stdout.write(summary_line(job) + "\n")
    return 1 if reader.failed else 0


def render_files(files: list[str], namespace: str | None = None, image: str | None = None) -> int:
    settings = OperatorSettings(runtime_image=image) if image else OperatorSettings()
    reader = Reader(sys.stderr, sys.stdin)
    objects: list[dict[str, Any]] = []
    for job, file in reader.jobs(files):
        ns = namespace or job.metadata.namespace or "default"
        try:
            if planning.is_auto(job):  # planned as the operator would with no node labels to read
                job = planning.apply(job, planning.plan_for(job, []))
            objects.extend(render_children(job, ns, settings).all())
        except (RenderError, CannotPlan) as e:
            reader.report([f"{file.source} ({job.metadata.name}): {e}"])
    if reader.failed:
        return 1
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=100))
    return 0
