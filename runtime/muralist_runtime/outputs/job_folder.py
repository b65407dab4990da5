"""A rank's job folder at set-up: the job file checked (resumed or refused), its chunks, and a
writing rank's layout prepared."""

from __future__ import annotations

from muralist_api.contract.output_format import Chunks
from muralist_api.runtime_spec import RuntimeSpec

from ..work.chunks import WorkPlan
from ..world.distributed import Layout
from . import layouts, parts, storage, writer
from .layouts import FilesLayout, WebDatasetLayout


def open_job_folder(runtime: RuntimeSpec, work: WorkPlan,
                    layout: Layout) -> tuple[writer.JobFile, WorkPlan, FilesLayout | WebDatasetLayout | None]:
    """The job file, the plan of work as the folder has it, and this rank's output layout (None on
    a rank that writes nothing). The first pod's first rank writes the job file: the world it runs in."""
    storage.mount(runtime)  # spec.output.uri: the output tree's files go to object storage
    jobfile = writer.JobFile(runtime)
    recorded, trust = jobfile.check_existing()
    # A folder resumed keeps its own chunks (its part files name them), whatever this world is.
    work = parts.resumed_plan(runtime, work, recorded)
    jobfile.chunks = Chunks(work.start, work.chunk_rows)
    if layout.hosts_store:
        jobfile.write(layout.describe())
    files = None
    if layout.writes_images:
        files = layouts.layout_for(runtime, layout.rank, trust)
        files.prepare()
    return jobfile, work, files
