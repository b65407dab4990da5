"""`dev-cluster.sh load` replaces a changed image in place and keeps the store consistent.

The image store outlives the node (it is kept between runs), so a load must not leave it in a
state the next one trips over: the previous version of an image stays whole while its successor
is unpacked, even if containerd collects garbage meanwhile; nothing of it outlives the load.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker_plugin import TEST_LABEL, Docker
from tests.e2e.conftest import RealCluster
from tests.kube_helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

IMAGE = "muralist-e2e-reload:test"
REF = f"docker.io/library/{IMAGE}"
KEEP_PREFIX = "muralist.local/keep/"  # hack/real-node.py's refs that hold a previous version
# A layer every version shares, then one of its own: large enough that unpacking it takes a while.
DOCKERFILE = """\
ARG BASE
FROM ${BASE}
RUN head -c 30000000 /dev/urandom > /shared
ARG VERSION
RUN echo "${VERSION}" > /version && head -c 200000000 /dev/urandom > /payload
"""


def build_version(docker: Docker, base: str, context: Path, version: str) -> str:
    """The test image at `version`; the chain ID of its top layer (its top snapshot in containerd)."""
    (context / "Dockerfile").write_text(DOCKERFILE)
    docker(
        "build",
        "--build-arg",
        f"BASE={base}",
        "--build-arg",
        f"VERSION={version}",
        "--label",
        TEST_LABEL,
        "-t",
        IMAGE,
        str(context),
    )
    docker.prune_replaced_builds()
    layers = json.loads(docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", IMAGE).stdout)
    chain = layers[0]
    for diff_id in layers[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
    return chain


def collect_garbage(cluster: RealCluster) -> None:
    """One collection, now: a synchronous image removal runs one."""
    cluster.ctr("images", "tag", "--force", "docker.io/library/muralist-pause:local", "gc-trigger")
    cluster.ctr("images", "rm", "--sync", "gc-trigger")


@contextlib.contextmanager
def garbage_collecting(cluster: RealCluster, *watched: str) -> Iterator[list[tuple[bool, ...]]]:
    """containerd collects garbage over and over while the body runs; yields, per collection,
    which of the `watched` snapshots existed after it."""
    seen: list[tuple[bool, ...]] = []
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            collect_garbage(cluster)
            seen.append(tuple(cluster.ctr("snapshots", "info", s, check=False).returncode == 0 for s in watched))

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=60)


def test_reloading_a_changed_image_keeps_its_previous_version_whole_until_the_new_one_is_unpacked(
    real_cluster: RealCluster, docker: Docker, base_image: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    # Two versions first: containerd's CRI plugin pins a newly named image by its ID, not one
    # imported over an existing name, so the version replaced below has nothing but its name.
    build_version(docker, base_image, tmp_path, f"{run}-1")
    real_cluster.dev_cluster("load", IMAGE)
    previous_top = build_version(docker, base_image, tmp_path, f"{run}-2")
    real_cluster.dev_cluster("load", IMAGE)
    new_top = build_version(docker, base_image, tmp_path, f"{run}-3")

    with garbage_collecting(real_cluster, previous_top, new_top) as seen:
        log = real_cluster.dev_cluster("load", IMAGE)
    assert f"import {IMAGE}" in log, log
    # Only the layer that changed travels, replayed from Docker's storage (no `docker save`).
    assert f"{IMAGE}: 1 of 3 layers sent, read from Docker's storage" in log, log
    while_unpacking = [previous for previous, new in seen if not new]
    assert len(while_unpacking) >= 3, f"only {len(while_unpacking)} collections ran before the new version was unpacked"
    assert all(while_unpacking), (
        f"the previous version's top snapshot was collected before the new one was unpacked: {while_unpacking}"
    )

    refs = real_cluster.ctr("images", "ls", "-q").stdout.split()
    assert REF in refs
    assert not [r for r in refs if r.startswith(KEEP_PREFIX)], refs
    collect_garbage(real_cluster)
    assert real_cluster.ctr("snapshots", "info", previous_top, check=False).returncode != 0, (
        "the previous version outlived the load"
    )
    assert read_version_in_a_pod(real_cluster, run) == f"{run}-3"


def read_version_in_a_pod(cluster: RealCluster, run: str) -> str:
    name = f"reload-{run}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never", "command": ["cat", "/version"]}],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:

        def done() -> bool:
            phase = cluster.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}").stdout
            return phase in ("Succeeded", "Failed")

        wait_for(done, timeout=120, message=f"pod {name} finished")
        return cluster.kubectl("logs", name).stdout.strip()
    finally:
        cluster.kubectl("delete", "pod", name, "--wait=false", check=False)


def test_a_load_killed_part_way_leaves_a_store_the_next_load_completes(
    real_cluster: RealCluster, docker: Docker, base_image: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    build_version(docker, base_image, tmp_path, f"{run}-1")
    argv, env = real_cluster.dev_cluster_command("load", IMAGE)
    load = subprocess.Popen(argv, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        wait_for(
            lambda: "extract-" in real_cluster.ctr("snapshots", "ls").stdout or load.poll() is not None,
            timeout=300,
            message="the load to start unpacking",
        )
        assert load.poll() is None, "the load finished before it could be killed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(load.pid, signal.SIGKILL)
        load.wait()

    log = real_cluster.dev_cluster("load", IMAGE)
    assert f"import {IMAGE}" in log, log
    assert not [r for r in real_cluster.ctr("images", "ls", "-q").stdout.split() if r.startswith(KEEP_PREFIX)]
    assert read_version_in_a_pod(real_cluster, run) == f"{run}-1"
