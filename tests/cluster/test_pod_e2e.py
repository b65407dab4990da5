"""The pods the operator creates really work: run their command here, with their environment.

kwok plays the pods in the API server (kept Running); this test takes each pod's container
command and environment as the API server has them, resolves the field references the
kubelet would, maps the volumes and the rendezvous DNS name to this machine, and runs one
process per pod index. The runtime renders the job, and its live progress reaches the
DiffusionJob's status through the progress ConfigMap with the pods' own least-privilege token.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from kubernetes import client
from muralist_runtime.spec import contract
from muralist_runtime.spec.contract import HF_HOME, OUTPUT_MOUNT, SPEC_DIR, SPEC_KEY

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for
from tests.operator_helpers import DJ

pytestmark = pytest.mark.cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_env(pod: Any, mounts: dict[str, Path], master_port: int) -> dict[str, str]:
    """What the kubelet would put in the container's environment, mapped to this machine."""
    env: dict[str, str] = {}
    for var in pod.spec.containers[0].env:
        if var.value is not None:
            value = var.value
        elif var.value_from.field_ref is not None:
            path = var.value_from.field_ref.field_path
            if path.startswith("metadata.annotations["):
                value = pod.metadata.annotations[path.split("'")[1]]
            elif path.startswith("metadata.labels["):
                value = pod.metadata.labels[path.split("'")[1]]
            else:
                value = {"metadata.namespace": pod.metadata.namespace, "metadata.name": pod.metadata.name}[path]
        else:
            continue  # a secretKeyRef: none in this job
        for in_pod, here in mounts.items():
            if value == in_pod or value.startswith(in_pod + "/"):
                value = str(here) + value[len(in_pod) :]
        env[var.name] = value
    # The headless Service's DNS name resolves to pod 0; here that is this machine.
    job = pod.metadata.labels["muralist.dev/job-name"]
    assert env[contract.PET_MASTER_ADDR] == f"{job}-0.{job}"
    env[contract.PET_MASTER_ADDR], env[contract.PET_MASTER_PORT] = "127.0.0.1", str(master_port)
    return env


def container_command(pod: Any, env: dict[str, str], spec_file: Path) -> list[str]:
    """The container's command as the kubelet runs it: `$(VAR)` expanded from its env, and the
    launcher's console script (torchrun, accelerate launch) run as a module of this Python."""
    command = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in pod.spec.containers[0].command]
    if command[0] == "torchrun":
        command = [*contract.local_program("torchrun", sys.executable), *command[1:]]
    else:
        assert command[:2] == ["accelerate", "launch"], command
        command = [*contract.local_program("accelerate", sys.executable), *command[2:]]
    command[command.index("--spec") + 1] = str(spec_file)
    return command


def runtime_token(kube_api: Any, namespace: str, account: str) -> str:
    request = {"spec": {"audiences": [], "expirationSeconds": 3600}}
    return client.CoreV1Api(kube_api).create_namespaced_service_account_token(account, namespace, request).status.token


class LocalNode:
    """This machine standing in for the kubelets: the pods' volumes as directories, and each
    pod's container command run as a process with the pod's resolved environment."""

    def __init__(self, dj: DJ, kube_api: Any, job: str, root: Path):
        self.dj, self.job, self.root = dj, job, root
        self.spec_dir, self.output, hf_home, self.tmp = (root / d for d in ("spec", "output", "hf", "tmp"))
        for d in (self.spec_dir, self.output, hf_home, self.tmp):
            d.mkdir()
        self.mounts = {SPEC_DIR: self.spec_dir, OUTPUT_MOUNT: self.output, HF_HOME: hf_home, "/tmp": self.tmp}
        # The spec ConfigMap as the kubelet would project it, its output path mapped here.
        runtime_spec = json.loads(dj.core.read_namespaced_config_map(f"{job}-spec", dj.ns).data[SPEC_KEY])
        runtime_spec["outputDir"] = str(self.output) + runtime_spec["outputDir"][len(OUTPUT_MOUNT) :]
        (self.spec_dir / SPEC_KEY).write_text(json.dumps(runtime_spec))
        self.api_url, self.ca_file = kube_api.configuration.host, kube_api.configuration.ssl_ca_cert
        self.kube_api = kube_api

    def start(self, pods: list[Any], extra_env: dict[str, str] | None = None) -> list[subprocess.Popen[bytes]]:
        token = runtime_token(self.kube_api, self.dj.ns, pods[0].spec.service_account_name)
        master_port = free_port()
        procs = []
        for pod in pods:
            env = resolve_env(pod, self.mounts, master_port)
            env.update(
                {
                    contract.MURALIST_KUBE_API: self.api_url,
                    contract.MURALIST_KUBE_TOKEN: token,
                    contract.MURALIST_KUBE_CA: self.ca_file,
                    contract.MURALIST_PROGRESS_DIR: str(self.root / f"progress-{pod.metadata.name}"),
                    "PATH": os.environ["PATH"],
                    "OMP_NUM_THREADS": "1",
                    **(extra_env or {}),
                }
            )
            command = container_command(pod, env, self.spec_dir / SPEC_KEY)
            with open(self.root / f"{pod.metadata.name}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp, start_new_session=True
                    )
                )
        return procs

    def wait(self, procs: list[subprocess.Popen[bytes]]) -> None:
        for proc in procs:
            code = proc.wait(timeout=240)
            assert code == 0, "\n".join(p.read_text()[-2000:] for p in self.root.glob("*.log"))

    @staticmethod
    def kill(procs: list[subprocess.Popen[bytes]]) -> None:
        """What the kubelet does to the containers of deleted pods: every process in them, the
        workers too (torchrun starts each in a session of its own, out of reach of a killpg)."""
        for proc in procs:
            if proc.poll() is None:
                workers = psutil.Process(proc.pid).children(recursive=True)
                os.killpg(proc.pid, signal.SIGKILL)  # the agent first, or it restarts the workers
                for worker in workers:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        worker.kill()
                proc.wait()

    def images(self) -> list[str]:
        return sorted(p.name for p in (self.output / self.job / "images").iterdir())


def by_index(pods: list[Any]) -> list[Any]:
    return sorted(pods, key=lambda p: int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"]))


def small_job(name: str) -> Any:
    return (
        make_job(name)
        .world(nodes=2, gpus=0, processes=1)
        .generation(steps=2, height=32, width=32, imagesPerPrompt=2, extraArgs={"max_sequence_length": 16})
        .pod_template(annotations=fate_annotations("run"))
    )


def test_rendered_pods_render_the_job(dj: DJ, kube_api: Any, tmp_path: Path) -> None:
    dj.create(small_job("e2e").prompts("a red fox", {"text": "a lighthouse", "seed": 5}, "a city at night").obj())
    pods = by_index(dj.wait_pods("e2e", 2))
    node = LocalNode(dj, kube_api, "e2e", tmp_path)
    node.wait(node.start(pods))
    output = node.output

    images = node.images()
    assert [i for i in images if i.endswith(".png")] == [f"{p:05d}-{i:03d}.png" for p in range(3) for i in range(2)]
    lines = (output / "e2e" / "manifest.jsonl").read_text().splitlines()
    assert len(lines) == 6 and (output / "e2e" / "index.html").is_file()

    # Progress came in through the ConfigMap, with the pods' own token, while the pods "ran".
    status = wait_for(
        lambda: (s := dj.status("e2e"))["progress"]["completed"] == 6 and s,
        timeout=30,
        message="status.progress.completed == 6",
    )
    assert status["phase"] == "Running" and status["progress"]["summary"] == "6/6"
    for pod in pods:
        set_pod_fate(dj.core, pod.metadata.name, dj.ns, "succeed", after="100ms")
    assert dj.wait_phase("e2e", "Succeeded")["progress"]["summary"] == "6/6"


def test_rendered_accelerate_command_runs_two_pods_to_completion(dj: DJ, kube_api: Any, tmp_path: Path) -> None:
    # The pods' `accelerate launch ...` (once rendered with both --cpu and --multi_gpu, which
    # accelerate refuses), as the kubelet would run it, on CPU across two pods.
    job = small_job("acc").set("spec.parallelism.launcher", "accelerate").prompts("a red fox", "a lighthouse")
    dj.create(job.obj())
    pods = by_index(dj.wait_pods("acc", 2))
    command = pods[0].spec.containers[0].command
    assert command[:2] == ["accelerate", "launch"] and "--cpu" not in command
    node = LocalNode(dj, kube_api, "acc", tmp_path)
    node.wait(node.start(pods))
    images = [i for i in node.images() if i.endswith(".png")]
    assert images == [f"{p:05d}-{i:03d}.png" for p in range(2) for i in range(2)]
    manifest = [json.loads(line) for line in (node.output / "acc" / "manifest.jsonl").read_text().splitlines()]
    assert {m["rank"] for m in manifest} == {0, 1}, "both pods rendered"


def test_stalled_rank_is_restarted_and_the_job_completes(dj: DJ, kube_api: Any, tmp_path: Path) -> None:
    manifest = small_job("stall").prompts("a red fox", "a lighthouse").run_policy(stallTimeoutSeconds=20).obj()
    dj.create(manifest)
    pods = by_index(dj.wait_pods("stall", 2, attempt=0))
    node = LocalNode(dj, kube_api, "stall", tmp_path)
    # Rank 1 blocks forever after its first image: alive (it still heartbeats), no progress.
    first = node.start(pods, {"MURALIST_TEST_HANG_AFTER": "1", "MURALIST_TEST_HANG_RANK": "1"})
    try:
        restarting = dj.wait_phase("stall", "Restarting", timeout=120)
    finally:
        node.kill(first)
    assert restarting["restarts"] == 1 and "no progress for" in restarting["message"]
    assert "Stalled" in dj.events("stall")

    node.wait(node.start(by_index(dj.wait_pods("stall", 2, attempt=1))))
    for pod in dj.pods("stall", attempt=1):
        set_pod_fate(dj.core, pod.metadata.name, dj.ns, "succeed", after="100ms")
    done = dj.wait_phase("stall", "Succeeded")
    assert done["restarts"] == 1 and done["progress"]["summary"] == "4/4"
    images = node.images()
    assert [i for i in images if i.endswith(".png")] == [f"{p:05d}-{i:03d}.png" for p in range(2) for i in range(2)]
    assert all(i.endswith((".png", ".json")) for i in images)  # no temporary files left behind
