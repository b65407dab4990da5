"""A rank's main path by stage: which stage folders main.py's steps call into, in what order.

Measured on a real run (the tiny model, one rank, no hub) under sys.setprofile: every call made
from a frame of muralist_runtime/main.py into a stage folder is recorded by its folder, and
consecutive calls into one folder count as one visit. The order must be the one main's
docstring gives on its `Stages:` line, and only the stages that bracket the run (the job folder,
progress) may be visited again (the docstring says why).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from muralist_runtime import main

from .conftest import make_job, runtime_spec_json

STAGES = ("plan", "world", "work", "model", "render", "outputs", "report")
# The stages that bracket the run (opened before the work, closed after it): the only ones entered twice.
BRACKETS = ("outputs", "report")

# Runs in a process of its own (the run sets up logging and its world); prints the calls as JSON.
PROBE = """
import json, sys
from pathlib import Path
import muralist_runtime
from muralist_runtime import main

root = Path(muralist_runtime.__file__).parent
main_file = str(root / "main.py")
stages = set(json.loads(sys.argv[2]))
calls = []

def stage_of(filename):
    parts = Path(filename).parts
    return parts[len(root.parts)] if Path(filename).is_relative_to(root) and len(parts) > len(root.parts) + 1 else None

def record(frame, event, arg):
    if event == "call" and frame.f_back is not None and frame.f_back.f_code.co_filename == main_file:
        code, step = frame.f_code, frame.f_back.f_code.co_name
        if (stage := stage_of(code.co_filename)) in stages:
            calls.append([stage, Path(code.co_filename).name, code.co_name, step])

sys.setprofile(record)
try:
    code = main.run(sys.argv[1])
finally:
    sys.setprofile(None)
print("STAGE-CALLS " + json.dumps({"code": code, "calls": calls}))
"""


def documented_order() -> list[str]:
    (line,) = [line for line in (main.__doc__ or "").splitlines() if line.strip().startswith("Stages:")]
    return [stage.strip() for stage in line.split(":", 1)[1].split(",")]


def visits(calls: list[list[str]]) -> list[str]:
    order: list[str] = []
    for stage, *_ in calls:
        if not order or order[-1] != stage:
            order.append(stage)
    return order


def test_the_main_path_enters_the_stages_in_the_documented_order(tmp_path: Path, runtime_env, tiny_model) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(runtime_spec_json(make_job().obj(), tmp_path / "out"))
    proc = subprocess.run([sys.executable, "-c", PROBE, str(spec), json.dumps(STAGES)], env=runtime_env,
                          capture_output=True, text=True, timeout=240)
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("STAGE-CALLS ")] or [None]
    assert line is not None, proc.stderr[-3000:]
    measured = json.loads(line.removeprefix("STAGE-CALLS "))
    assert measured["code"] == 0, proc.stderr[-3000:]
    order = visits(measured["calls"])
    calls = "\n".join(" ".join(call) for call in measured["calls"])
    assert order == documented_order(), f"measured: {', '.join(order)}\ncalls (stage, file, function, step):\n{calls}"
    assert sorted(set(order)) == sorted(STAGES), "every stage is on the main path"
    again = sorted({stage for stage in order if order.count(stage) > 1} - set(BRACKETS))
    assert not again, f"entered more than once: {again} (measured: {', '.join(order)})"
