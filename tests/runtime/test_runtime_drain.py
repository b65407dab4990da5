"""A pod told to stop (SIGTERM: a resize that removes it, preemption, eviction) drains: it finishes
the item in flight, keeps what it wrote, hands its chunk back, and the other pods finish the job
with every item exactly once. Two pods under the launch entry point, as the operator starts them."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from muralist_api import contract

from .conftest import make_job, runtime_spec_json

pytestmark = pytest.mark.torchrun

PROMPTS = 6
IMAGES_PER_PROMPT = 4  # one prompt per chunk: four items, so a chunk can be left half done
KEYS = sorted(f"{p:05d}-{i:03d}" for p in range(PROMPTS) for i in range(IMAGES_PER_PROMPT))


def _written_by(out: Path, rank: int) -> list[str]:
    found = []
    for meta in (out / "images").glob("*.json"):
        try:
            if json.loads(meta.read_text()).get("rank") == rank:
                found.append(meta.stem)
        except ValueError:
            continue  # being written (it is renamed into place, but be safe)
    return sorted(found)


def test_a_pod_told_to_stop_finishes_its_item_and_hands_back_its_chunk(tmp_path: Path, runtime_env, tiny_model) -> None:
    from muralist_api.runtime_spec import RuntimeSpec
    from muralist_runtime import local

    out = tmp_path / "drain"
    job = (make_job().prompts(*(f"a {c} square" for c in ("red", "green", "blue", "white", "black", "grey")))
           .processes(1, nodes=2).generation(imagesPerPrompt=IMAGES_PER_PROMPT).obj())
    spec_json = runtime_spec_json(job, out)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec_json)
    runtime = RuntimeSpec.model_validate_json(spec_json)
    procs, terminations = [], []
    for node, (argv, agent_env) in enumerate(local.agent_commands(runtime, str(spec_file), *local.local_ports(2))):
        term = tmp_path / f"termination-{node}"
        terminations.append(term)
        env = {**runtime_env, **agent_env, contract.MURALIST_TERMINATION_LOG: str(term),
               contract.MURALIST_PROGRESS_DIR: str(tmp_path / f"progress-{node}"),
               # The second pod is slow (a second per step): it is always in the middle of an item. The
               # first one is slowed too, so that it cannot take every chunk while the second one loads.
               contract.MURALIST_TEST_SLOW_RANK: str(node), contract.MURALIST_TEST_STEP_SLEEP: ("0.2", "1.0")[node]}
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 180
    while not _written_by(out, 1) and time.monotonic() < deadline and procs[1].poll() is None:
        time.sleep(0.2)
    kept = _written_by(out, 1)
    if not kept:
        for p in procs:
            p.kill()
        pytest.fail("the slow pod wrote no item: " + "\n".join(e[-3000:] for _, e in (p.communicate() for p in procs)))
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=240) for p in procs]
    stderr = [e for _, e in outs]

    assert procs[1].returncode == contract.DRAINED_EXIT_CODE, stderr[1][-3000:]
    assert "muralist: drained: stopped in chunk" in stderr[1] and "handed back" in stderr[1]
    assert "Traceback" not in stderr[1] and "ChildFailedError" not in stderr[1], "one line, no launcher dump"
    verdict = json.loads(terminations[1].read_text())
    assert (verdict["reason"], verdict["exitCode"]) == ("Drained", contract.DRAINED_EXIT_CODE)
    assert procs[0].returncode == 0, stderr[0][-3000:]

    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [m["key"] for m in manifest] == KEYS, "every item once"
    by_rank = {m["key"]: m["rank"] for m in manifest}
    drained_items = _written_by(out, 1)
    assert set(kept) <= set(drained_items), "what the drained pod wrote is kept, not rendered again"
    assert len(drained_items) <= len(kept) + 1, "it finished at most the item in flight after the signal"
    assert all(by_rank[k] == 0 for k in set(KEYS) - set(drained_items)), "the first pod rendered the rest"
    rendered = [json.loads(line.removeprefix(contract.PROGRESS_LINE_PREFIX))
                for o, _ in outs for line in o.splitlines() if line.startswith(contract.PROGRESS_LINE_PREFIX)]
    completed = sorted(e["key"] for e in rendered if e["event"] == "completed")
    assert completed == KEYS, "each item rendered exactly once across both pods"
    assert not list(out.rglob(".*.tmp")), "no temp files left"
