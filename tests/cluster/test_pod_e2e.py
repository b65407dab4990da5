"""The pods the operator creates really work: run their command here, with their environment.

kwok plays the pods in the API server (kept Running); this test takes each pod's container
command and environment as the API server has them, resolves the field references the
kubelet would, maps the volumes (the spec ConfigMap with its CA, the projected progress token)
and the pod-0 DNS name of the work-claim store to this machine, and runs one process per pod.
Each pod is a torchrun world of its own. The runtime renders the job, and its live progress
reaches the DiffusionJob's status through the operator's HTTPS endpoint, authenticated by a
token bound to that pod with audience muralist.dev, exactly what the kubelet would mount.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from muralist_api import contract
from muralist_api.contract import (
    HF_HOME,
    OUTPUT_MOUNT,
    PROGRESS_AUDIENCE,
    PROGRESS_CA_KEY,
    PROGRESS_TOKEN_DIR,
    PROGRESS_TOKEN_FILE,
    SPEC_DIR,
    SPEC_KEY,
)

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for
from tests.operator_helpers import DJ, free_port, pod_index

RUNTIME = Path(contract.__file__).resolve().parents[1]
# The runtime's half of issue 16 (its progress poster, per-pod worlds, work claiming) lands
# separately: until the runtime reads MURALIST_PROGRESS_URL these tests cannot pass.
RUNTIME_POSTS_PROGRESS = any(contract.MURALIST_PROGRESS_URL in p.read_text() for p in RUNTIME.rglob("*.py")
                             if "spec" not in p.parts)
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not RUNTIME_POSTS_PROGRESS, reason="waits for the runtime side of issue 16 (a progress "
                       "poster reading MURALIST_PROGRESS_URL, per-pod worlds, work claiming)"),
]


def field(pod: Any, path: str) -> str:
    if path.startswith("metadata.annotations["):
        return str((pod.metadata.annotations or {}).get(path.split("'")[1], ""))  # the kubelet: "" when absent
    if path.startswith("metadata.labels["):  # the Job controller's own JOB_COMPLETION_INDEX
        return str((pod.metadata.labels or {}).get(path.split("'")[1], ""))
    return str({"metadata.namespace": pod.metadata.namespace, "metadata.name": pod.metadata.name}[path])


def map_path(value: str, mounts: dict[str, Path]) -> str:
    for in_pod, here in mounts.items():
        if value == in_pod or value.startswith(in_pod + "/"):
            return str(here) + value[len(in_pod):]
    return value


def resolve_env(pod: Any, mounts: dict[str, Path], claims_port: int) -> dict[str, str]:
    """What the kubelet would put in the container's environment, mapped to this machine."""
    env: dict[str, str] = {}
    for var in pod.spec.containers[0].env:
        if var.value is not None:
            value = var.value
        elif var.value_from.field_ref is not None:
            value = field(pod, var.value_from.field_ref.field_path)
        else:
            continue  # a secretKeyRef: none in this job
        env[var.name] = map_path(value, mounts)
    # Every pod is a world of its own on loopback; here they share one machine: a port each.
    assert (env[contract.PET_NNODES], env[contract.PET_MASTER_ADDR]) == ("1", "127.0.0.1")
    env[contract.PET_MASTER_PORT] = str(free_port())
    # Pod 0 hosts the work-claim store at <job>-0.<job>: here that is this machine.
    job = pod.metadata.labels["muralist.dev/job-name"]
    assert env[contract.MURALIST_CLAIMS_ADDR] == f"{job}-0.{job}:{contract.CLAIMS_PORT}"
    env[contract.MURALIST_CLAIMS_ADDR] = f"127.0.0.1:{claims_port}"
    return env


def container_command(pod: Any, spec_file: Path) -> list[str]:
    """The container's command as the kubelet runs it, `python` being this interpreter."""
    command = list(pod.spec.containers[0].command)
    assert command == contract.pod_command(), command
    return [sys.executable, *command[1:-1], str(spec_file)]


class LocalNode:
    """This machine standing in for the kubelets: the pods' volumes as directories (the
    projected token written from a TokenRequest bound to the pod), and each pod's container
    command run as a process with the pod's resolved environment."""

    def __init__(self, dj: DJ, job: str, root: Path):
        self.dj, self.job, self.root = dj, job, root
        self.spec_dir, self.output, self.hf_home, self.tmp = (root / d for d in ("spec", "output", "hf", "tmp"))
        for d in (self.spec_dir, self.output, self.hf_home, self.tmp):
            d.mkdir()
        # The spec ConfigMap as the kubelet would project it, its output path mapped here.
        data = dj.core.read_namespaced_config_map(f"{job}-spec", dj.ns).data
        runtime_spec = json.loads(data[SPEC_KEY])
        runtime_spec["outputDir"] = str(self.output) + runtime_spec["outputDir"][len(OUTPUT_MOUNT):]
        (self.spec_dir / SPEC_KEY).write_text(json.dumps(runtime_spec))
        (self.spec_dir / PROGRESS_CA_KEY).write_text(data[PROGRESS_CA_KEY])
        self.claims_port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def token(self, pod: Any) -> Path:
        """The projected serviceAccountToken volume of this pod."""
        volume = next(v for v in pod.spec.volumes if v.projected is not None)
        source = volume.projected.sources[0].service_account_token
        assert (source.audience, source.expiration_seconds) == (PROGRESS_AUDIENCE, contract.PROGRESS_TOKEN_SECONDS)
        spec = {"audiences": [source.audience], "expirationSeconds": source.expiration_seconds,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
                                   "uid": pod.metadata.uid}}
        account = pod.spec.service_account_name or "default"
        token = self.dj.core.create_namespaced_service_account_token(account, self.dj.ns, {"spec": spec}).status.token
        directory = self.root / f"token-{pod.metadata.name}"
        directory.mkdir()
        (directory / PROGRESS_TOKEN_FILE.removeprefix(PROGRESS_TOKEN_DIR + "/")).write_text(token)
        return directory

    def start(self, pod: Any, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        mounts = {SPEC_DIR: self.spec_dir, OUTPUT_MOUNT: self.output, HF_HOME: self.hf_home, "/tmp": self.tmp,
                  PROGRESS_TOKEN_DIR: self.token(pod)}
        env = resolve_env(pod, mounts, self.claims_port)
        assert "KUBERNETES_SERVICE_HOST" not in env and not any(v.startswith("MURALIST_KUBE") for v in env), (
            "no API credentials")
        env.update({
            contract.MURALIST_PROGRESS_DIR: str(self.root / f"progress-{pod.metadata.name}"),
            contract.MURALIST_TERMINATION_LOG: str(self.root / f"termination-{pod.metadata.name}"),
            "PATH": os.environ["PATH"],
            "OMP_NUM_THREADS": "1",
            **(extra_env or {}),
        })
        with open(self.root / f"{pod.metadata.name}.log", "wb") as log:
            proc = subprocess.Popen(container_command(pod, self.spec_dir / SPEC_KEY), env=env, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=self.tmp, start_new_session=True)
        self.procs[pod.metadata.name] = proc
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.root.glob("*.log")))

    def wait(self, procs: list[subprocess.Popen[bytes]]) -> None:
        for proc in procs:
            code = proc.wait(timeout=240)
            assert code == 0, self.logs()

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """What the kubelet does to the container of a deleted pod: every process in it, the
        workers too (torchrun starts each in a session of its own, out of reach of a killpg)."""
        if proc.poll() is None:
            workers = psutil.Process(proc.pid).children(recursive=True)
            os.killpg(proc.pid, signal.SIGKILL)  # the agent first, or it restarts the workers
            for worker in workers:
                with contextlib.suppress(psutil.NoSuchProcess):
                    worker.kill()
            proc.wait()

    def images(self) -> list[str]:
        return sorted(p.name for p in (self.output / self.job / "images").iterdir())


def small_job(name: str) -> Any:
    return (
        make_job(name)
        .world(nodes=2, gpus=0, processes=1)
        .generation(steps=2, height=32, width=32, imagesPerPrompt=2, extraArgs={"max_sequence_length": 16})
        .pod_template(annotations=fate_annotations("run"))
    )


def pngs(node: LocalNode) -> list[str]:
    return [i for i in node.images() if i.endswith(".png")]


def test_rendered_pods_render_the_job_and_push_their_progress(dj: DJ, tmp_path: Path) -> None:
    dj.create(small_job("e2e").prompts("a red fox", {"text": "a lighthouse", "seed": 5}, "a city at night").obj())
    pods = dj.wait_pods("e2e", 2)
    node = LocalNode(dj, "e2e", tmp_path)
    node.wait([node.start(p) for p in pods])

    assert pngs(node) == [f"{p:05d}-{i:03d}.png" for p in range(3) for i in range(2)]
    lines = (node.output / "e2e" / "manifest.jsonl").read_text().splitlines()
    assert len(lines) == 6 and (node.output / "e2e" / "index.html").is_file()
    manifest = [json.loads(line) for line in lines]
    assert len({m["key"] for m in manifest}) == 6  # every image exactly once

    # The counts came in over HTTPS while the pods "ran" (kwok still shows them Running).
    status = wait_for(lambda: (s := dj.status("e2e"))["progress"]["completed"] == 6 and s, timeout=30,
                      message="status.progress.completed == 6")
    assert status["phase"] == "Running" and status["progress"]["summary"] == "6/6"
    assert status["progress"]["percent"] == 100.0 and status["progress"]["estimatedSecondsRemaining"] == 0
    for pod in pods:
        set_pod_fate(dj.core, pod.metadata.name, dj.ns, "succeed", after="100ms")
    assert dj.wait_phase("e2e", "Succeeded")["progress"]["summary"] == "6/6"


def test_rendered_accelerate_command_runs_two_pods_to_completion(dj: DJ, tmp_path: Path) -> None:
    # The launch entry point builds `accelerate launch ...` for each pod's own world.
    job = small_job("acc").set("spec.parallelism.launcher", "accelerate").prompts("a red fox", "a lighthouse")
    dj.create(job.obj())
    pods = dj.wait_pods("acc", 2)
    node = LocalNode(dj, "acc", tmp_path)
    node.wait([node.start(p) for p in pods])
    assert pngs(node) == [f"{p:05d}-{i:03d}.png" for p in range(2) for i in range(2)]
    manifest = [json.loads(line) for line in (node.output / "acc" / "manifest.jsonl").read_text().splitlines()]
    # Both pods ran to exit 0 (node.wait); which one claimed which chunk is up to their speed.
    assert [m["key"] for m in manifest] == [f"{p:05d}-{i:03d}" for p in range(2) for i in range(2)]


def test_a_stalled_pod_is_retried_alone_and_the_job_completes(dj: DJ, tmp_path: Path) -> None:
    prompts = ["a red fox", "a lighthouse", "a castle", "a boat", "an owl", "a mural"]
    manifest = small_job("stall").prompts(*prompts).run_policy(stallTimeoutSeconds=20).obj()
    dj.create(manifest)
    pods = {pod_index(p): p for p in dj.wait_pods("stall", 2)}
    node = LocalNode(dj, "stall", tmp_path)
    # Pod 1's rank (global rank 1) blocks forever after its first image: alive, no progress. Pod 0
    # is slowed down (half a second a step) so that pod 1 surely claims work before it is gone.
    first = node.start(pods[0], {contract.MURALIST_TEST_STEP_SLEEP: "0.5", contract.MURALIST_TEST_SLOW_RANK: "0"})
    stuck = node.start(pods[1], {contract.MURALIST_TEST_HANG_AFTER: "1", contract.MURALIST_TEST_HANG_RANK: "1"})
    try:
        retried = wait_for(lambda: (s := dj.status("stall")).get("restarts") == 1 and s, timeout=120,
                           message="the stalled pod retried")
    finally:
        node.kill(stuck)
    assert retried["phase"] == "Running"
    assert [(e["index"], e["lastFailureReason"]) for e in retried["indexes"]] == [(1, "Stalled")]
    assert "no progress for" in retried["indexes"][0]["lastFailure"]
    dj.wait_events("stall", "Stalled")

    # Only pod 1 goes: the Job controller starts its index again; pod 0 keeps its uid and runs on.
    again = wait_for(lambda: next((p for p in dj.pods("stall", index=1) if p.status.phase == "Running"
                                   and p.metadata.uid != pods[1].metadata.uid), None), timeout=60,
                     message="a new pod for index 1")
    assert [p.metadata.uid for p in dj.pods("stall", index=0)] == [pods[0].metadata.uid]
    node.wait([first, node.start(again)])
    for pod in dj.pods("stall"):
        if pod.status.phase == "Running":
            set_pod_fate(dj.core, pod.metadata.name, dj.ns, "succeed", after="100ms")
    done = dj.wait_phase("stall", "Succeeded")
    assert done["restarts"] == 1 and done["progress"]["summary"] == "12/12"
    assert pngs(node) == [f"{p:05d}-{i:03d}.png" for p in range(6) for i in range(2)]
    assert all(i.endswith((".png", ".json")) for i in node.images())  # no temporary files left behind
