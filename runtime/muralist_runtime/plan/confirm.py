"""Before loading: the memory estimate of this job's layout, and the Auto plan confirmed by what this rank
measures.

The estimate (muralist_api.planner.memory) is made for every job whose model's sizes are known: the
safetensors headers of a local folder (model/sizes.py; a built-in tiny model, a staged or mounted
one), else the planner's catalog figures of a hub model it names (the pods make no hub requests for
it: thousands of ranks reading a repo's headers at once would be a storm); the job file records it
beside each rank's measured peak. A job whose strategy was Auto carries its plan in the
runtime spec (`parallel_plan`, made by the operator from the nodes' labels or by `muralist run` from
this machine); here each rank measures what the plan assumed (the free memory of the devices it will
use, and whether the pod's GPUs reach each other's memory when the plan counted on NVLink) and a
plan the measurements contradict fails the run at once with exit 78, naming the measured figure,
before minutes of loading.

Measured where: on a GPU, `torch.cuda.mem_get_info` of this rank's device (all of the pod's for
DeviceMap); on CPU, the memory this process may still take (the cgroup's limit less its use, or
MemAvailable) shared by the pod's processes. MURALIST_TEST_DEVICE_MEMORY stands in for it in tests.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from muralist_api.contract import PermanentFailure
from muralist_api.contract.env import PodEnv
from muralist_api.planner.confirm import Measured, confirm_problems, layout_estimate
from muralist_api.planner.device import parse_size
from muralist_api.planner.facts import ModelFacts
from muralist_api.planner.known import known_facts
from muralist_api.runtime_spec import RuntimeSpec

from ..model.sizes import try_read_facts

log = logging.getLogger("muralist")
MIB = 1 << 20
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
CGROUP_USAGE = (Path("/sys/fs/cgroup/memory.current"), Path("/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def _first_int(paths: tuple[Path, ...]) -> int | None:
    for path in paths:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def measure(gpu: bool, device_map: bool, env: PodEnv | None = None) -> Measured:
    """What this rank has to run in, before anything loads."""
    env = env or PodEnv.from_environ()
    if env.faults.device_memory:
        return Measured(parse_size(env.faults.device_memory), None, "free memory (MURALIST_TEST_DEVICE_MEMORY)")
    if gpu:
        import torch

        count = torch.cuda.device_count()
        mine = list(range(count)) if device_map else [env.local_rank % max(1, count)]
        free = min(torch.cuda.mem_get_info(i)[0] for i in mine)
        peers = all(torch.cuda.can_device_access_peer(i, j) for i in range(count) for j in range(count) if i != j)
        return Measured(free, peers if count > 1 else None, f"free memory on GPU {', '.join(map(str, mine))}")
    limit, used = _first_int(CGROUP_LIMITS), _first_int(CGROUP_USAGE)
    room = [r for r in (mem_available(), (limit - used) if limit is not None and used is not None else None)
            if r is not None]
    if not room:
        return Measured(0, None, "free memory (unknown)")
    share = max(1, env.local_world_size)
    return Measured(min(room) // share, None, f"free host memory shared by the pod's {share} process(es)")


def confirm(runtime: RuntimeSpec, source: str, revision: str | None, gpu: bool) -> dict[str, Any]:
    """The job file's estimate (empty when the model's sizes cannot be read); raises PermanentFailure
    when this rank's measurements contradict the job's Auto plan."""
    spec, plan = runtime.spec, runtime.parallel_plan
    # A local folder's headers; a hub model's figures from the catalog: every rank of every pod reading a
    # repo's headers at once would be thousands of requests to the hub (`muralist plan` reads them, once).
    facts: ModelFacts | None = try_read_facts(source) if Path(source).is_dir() else known_facts(spec.model.name)
    estimate = layout_estimate(facts, spec) if facts is not None else None
    if plan is not None:
        measured = measure(gpu, spec.parallelism.strategy == "DeviceMap")
        if measured.free_memory > 0:
            problems = confirm_problems(plan, facts, spec, measured)
            if problems:
                raise PermanentFailure(*problems[0])
            log.info("plan confirmed: %s; %s: %.0f MiB", plan.summary, measured.what, measured.free_memory / MIB)
    if estimate is None:
        return {}
    return {"estimatedPeakMiB": round(estimate.peak / MIB, 1), "estimate": {
        "weightsMiB": round(estimate.weights / MIB, 1), "activationsMiB": round(estimate.activations / MIB, 1),
        "vaeDecodeMiB": round(estimate.vae_decode / MIB, 1)}, "estimateFrom": facts.source if facts else ""}
