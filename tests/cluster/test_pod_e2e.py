"""The pods the operator creates really work: run their command here, with their environment.

kwok plays the pods in the API server (kept Running); this test takes each pod's container
command and environment as the API server has them, resolves the field references the
kubelet would, maps the volumes and the rendezvous DNS name to this machine, and runs one
process per pod index. The runtime renders the job, and its live progress reaches the
DiffusionJob's status through the progress ConfigMap with the pods' own least-privilege token.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from muralist_operator.render import HF_HOME, OUTPUT_MOUNT, SPEC_DIR, SPEC_KEY

from tests.builders import make_job
from tests.cluster.conftest import DJ
from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for

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
    assert (
        env["PET_MASTER_ADDR"]
        == f"{pod.metadata.labels['muralist.dev/job-name']}-0." + pod.metadata.labels["muralist.dev/job-name"]
    )
    env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"] = "127.0.0.1", str(master_port)
    return env


def runtime_token(kube_api: Any, namespace: str, account: str) -> str:
    request = {"spec": {"audiences": [], "expirationSeconds": 3600}}
    return client.CoreV1Api(kube_api).create_namespaced_service_account_token(account, namespace, request).status.token


def test_rendered_pods_render_the_job(dj: DJ, kube_api: Any, tmp_path: Path) -> None:
    manifest = (
        make_job("e2e")
        .world(nodes=2, gpus=0, processes=1)
        .prompts("a red fox", {"text": "a lighthouse", "seed": 5}, "a city at night")
        .generation(steps=2, height=32, width=32, imagesPerPrompt=2, extraArgs={"max_sequence_length": 16})
        .pod_template(annotations=fate_annotations("run"))
        .obj()
    )
    dj.create(manifest)
    pods = sorted(
        dj.wait_pods("e2e", 2), key=lambda p: int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"])
    )

    # The volumes: the spec ConfigMap as the kubelet would project it, the rest as empty dirs.
    spec_dir, output, hf_home, tmp = (tmp_path / d for d in ("spec", "output", "hf", "tmp"))
    for d in (spec_dir, output, hf_home, tmp):
        d.mkdir()
    mounts = {SPEC_DIR: spec_dir, OUTPUT_MOUNT: output, HF_HOME: hf_home, "/tmp": tmp}
    spec_json = dj.core.read_namespaced_config_map("e2e-spec", dj.ns).data[SPEC_KEY]
    runtime_spec = json.loads(spec_json)
    runtime_spec["outputDir"] = str(output) + runtime_spec["outputDir"][len(OUTPUT_MOUNT) :]
    (spec_dir / SPEC_KEY).write_text(json.dumps(runtime_spec))

    api_url = kube_api.configuration.host
    ca_file = kube_api.configuration.ssl_ca_cert
    token = runtime_token(kube_api, dj.ns, pods[0].spec.service_account_name)
    master_port = free_port()
    procs = []
    for pod in pods:
        container = pod.spec.containers[0]
        env = resolve_env(pod, mounts, master_port)
        env.update(
            {
                "MURALIST_KUBE_API": api_url,
                "MURALIST_KUBE_TOKEN": token,
                "MURALIST_KUBE_CA": ca_file,
                "PATH": os.environ["PATH"],
                "OMP_NUM_THREADS": "1",
            }
        )
        command = list(container.command)
        assert command[0] == "torchrun"
        command = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
        command[command.index("--spec") + 1] = str(spec_dir / SPEC_KEY)
        log = open(tmp_path / f"{pod.metadata.name}.log", "wb")  # noqa: SIM115 (closed with the process)
        procs.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp), log))
    for proc, log in procs:
        code = proc.wait(timeout=240)
        log.close()
        assert code == 0, (tmp_path / Path(log.name).name).read_text()[-3000:]

    images = sorted(p.name for p in (output / "e2e" / "images").glob("*.png"))
    assert images == [f"{p:05d}-{i:03d}.png" for p in range(3) for i in range(2)]
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
