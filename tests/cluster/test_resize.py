"""Resizing a running DiffusionJob on the real control plane (kwok plays the pods): `kubectl scale`
moves the elastic Indexed Job, pods of removed indexes go without counting as failures, and only
pod-local layouts may change size."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from muralist_api.job import GROUP, PLURAL, VERSION

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for
from tests.operator_helpers import DJ, pod_index

pytestmark = pytest.mark.cluster


def kubectl(control_plane: Any, namespace: str, *args: str) -> str:
    proc = subprocess.run([str(control_plane.bin_dir / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig),
                           "-n", namespace, *args], capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def live_indexes(dj: DJ, name: str) -> list[int]:
    return sorted(pod_index(p) for p in dj.pods(name)
                  if p.status.phase == "Running" and not p.metadata.deletion_timestamp)


def test_kubectl_scale_grows_and_shrinks_a_running_job(dj: DJ, control_plane: Any) -> None:
    dj.create(make_job("grow").world(nodes=2, gpus=1).pod_template(annotations=fate_annotations("run")).obj())
    dj.wait_pods("grow", 2)
    dj.wait_phase("grow", "Running")

    kubectl(control_plane, dj.ns, "scale", "dj/grow", "--replicas=4")
    job = wait_for(lambda: (j := dj.batch.read_namespaced_job("grow", dj.ns)).spec.completions == 4 and j,
                   message="the Job grown to 4")
    assert job.spec.parallelism == 4
    wait_for(lambda: live_indexes(dj, "grow") == [0, 1, 2, 3], message="4 running pods")
    grown = wait_for(lambda: (s := dj.status("grow")).get("nodes") == 4 and s, message="status.nodes 4")
    scale = dj.custom.get_namespaced_custom_object_scale(GROUP, VERSION, dj.ns, PLURAL, "grow")
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (4, 4)
    assert scale["status"]["selector"] == grown["selector"] and "muralist.dev/job-name=grow" in grown["selector"]
    assert len(dj.core.list_namespaced_pod(dj.ns, label_selector=grown["selector"]).items) == 4

    kubectl(control_plane, dj.ns, "scale", "dj/grow", "--replicas=1")
    wait_for(lambda: dj.batch.read_namespaced_job("grow", dj.ns).spec.completions == 1, message="the Job shrunk")
    wait_for(lambda: live_indexes(dj, "grow") == [0], message="only the first pod left")
    shrunk = wait_for(lambda: (s := dj.status("grow")).get("nodes") == 1 and s, message="status.nodes 1")
    assert shrunk["phase"] == "Running" and shrunk["restarts"] == 0 and not shrunk.get("indexes"), shrunk
    out = kubectl(control_plane, dj.ns, "get", "dj", "grow")
    header, row = out.splitlines()[:2]
    starts = [header.index(name) for name in header.split()]  # columns are aligned; ETA may be empty
    columns = {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}
    assert (columns["PODS"], columns["DESIRED"]) == ("1", "1")
    dj.wait_events("grow", "Resized")

    first = next(p for p in dj.pods("grow") if pod_index(p) == 0 and not p.metadata.deletion_timestamp)
    set_pod_fate(dj.core, first.metadata.name, dj.ns, "succeed")
    done = dj.wait_phase("grow", "Succeeded")
    assert done["restarts"] == 0


def test_only_the_size_of_a_pod_local_layout_may_change(dj: DJ) -> None:
    # A context-parallel group spanning two pods: neither pod can go alone.
    spanning = (make_job("span").world(nodes=2, gpus=1, processes=1).context_parallel(ulysses=2)
                .run_policy(suspend=True).obj())
    dj.create(spanning)
    with pytest.raises(ApiException) as err:
        dj.patch_spec("span", {"parallelism": {"nodes": 4}})
    assert err.value.status == 422
    assert "spec.parallelism.nodes can change while the job runs only when each context-parallel group fits" in (
        err.value.body)
    with pytest.raises(ApiException) as err:
        dj.patch_spec("span", {"parallelism": {"gpusPerNode": 2}})
    assert err.value.status == 422 and "spec.parallelism: only nodes can change after creation" in err.value.body
    dj.create(make_job("local").world(nodes=2, gpus=1).run_policy(suspend=True).obj())
    assert dj.patch_spec("local", {"parallelism": {"nodes": 3}})["spec"]["parallelism"]["nodes"] == 3
