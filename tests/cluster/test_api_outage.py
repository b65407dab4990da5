"""The operator stays live when the API server stops answering. Its kubeconfig points at a TCP
proxy on loopback (tests/tcp_proxy.py) that, for a minute, accepts connections and carries
nothing on any of them (those open at that moment stay dead for good, as behind a load balancer
that lost its upstream). Once the proxy carries new connections again, the deadline policy and
the stall check, both the operator's clock's, still fire, and nothing has waited forever: every
API call has a timeout (kube.py), the clock runs reconciles on worker threads and retries a
failed one with backoff (reconciler.py).

While the API server is silent the pods keep posting progress (the endpoint is the operator's
own, not behind the proxy; the TokenReviews are, so the first posts come before the silence and
leave their verdicts cached): counts to write, a pod that stops stepping. So the operator has
calls in flight when the silence begins and tries more during it. The session's operator is
stopped meanwhile: two operators would both act on the jobs."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.builders import make_job
from tests.cluster_plugin import load_controlplane
from tests.kube_helpers import fate_annotations, wait_for
from tests.operator_helpers import DJ, OperatorProcess, pod_index
from tests.progress_poster import Poster
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.cluster

SILENCE_SECONDS = 60
# From the end of the silence: a dead pooled connection costs a read timeout (15 s) before the
# client drops it, a failed reconcile waits its backoff, kopf's watches resume within their
# inactivity timeout (70 s from their last event).
RECOVERY_SECONDS = 60


def running(name: str, nodes: int, **policy: Any) -> dict[str, Any]:
    job = make_job(name).prompts(*[f"prompt {i}" for i in range(20)]).world(nodes=nodes, gpus=1)
    # An output every pod mounts, which kwok runs (it mounts nothing).
    job = job.output(volume={"nfs": {"server": "nfs.example", "path": "/results"}})
    return job.run_policy(**policy).pod_template(annotations=fate_annotations("run")).obj()


def proxied_kubeconfig(kubeconfig: Path, proxy: TcpProxy, into: Path) -> Path:
    """The control plane's kubeconfig with the proxy as the API server (the certificate names
    127.0.0.1, whatever the port)."""
    server = load_controlplane().kubeconfig_server(kubeconfig)
    into.write_text(kubeconfig.read_text().replace(f"server: {server}", f"server: https://127.0.0.1:{proxy.port}"))
    return into


def test_an_api_server_silent_for_a_minute_stops_neither_the_deadline_nor_the_stall_check(
        control_plane: Any, kube_api: Any, namespace: str, operator: OperatorProcess, tmp_path: Path) -> None:
    server = urlsplit(load_controlplane().kubeconfig_server(control_plane.kubeconfig))
    dj = DJ(kube_api, namespace)
    with TcpProxy((server.hostname or "127.0.0.1", server.port or 443)) as proxy:
        operator.stop()
        proxied = OperatorProcess(proxied_kubeconfig(control_plane.kubeconfig, proxy, tmp_path / "kubeconfig"),
                                  tmp_path)
        proxied.start()
        try:
            # A job whose pod 1 will stop stepping (posting still), and one with a deadline that
            # passes while the API server is silent.
            dj.create(running("stall", nodes=2, stallTimeoutSeconds=10))
            stall_pods = {pod_index(p): p for p in dj.wait_pods("stall", 2)}
            dj.create(running("deadline", nodes=1, activeDeadlineSeconds=25))
            [deadline_pod] = dj.wait_pods("deadline", 1)
            posters = [Poster(dj, stall_pods[0]), Poster(dj, stall_pods[1]), Poster(dj, deadline_pod)]
            for p in posters:
                assert wait_for(lambda p=p: p.post(1, 20)[0] == 204, timeout=30, message="the first post accepted")

            proxy.hold()
            silence_ends = time.monotonic() + SILENCE_SECONDS
            frozen = datetime.now(UTC)  # pod 1's last step
            completed = 1
            while time.monotonic() < silence_ends:  # the pods post every second meanwhile
                completed = min(completed + 1, 19)
                for p, done, step in ((posters[0], completed, None), (posters[1], 1, frozen),
                                      (posters[2], completed, None)):
                    assert p.post(done, 20, step=step)[0] == 204  # from the endpoint's memory alone
                time.sleep(1.0)
            proxy.resume()

            failed = wait_for(lambda: (s := dj.status("deadline")).get("phase") == "Failed" and s,
                              timeout=RECOVERY_SECONDS, message="the deadline job Failed")
            assert [c["reason"] for c in failed["conditions"] if c["type"] == "Failed"] == ["DeadlineExceeded"]

            def gone(pod: Any) -> bool:
                now = dj.core.list_namespaced_pod(namespace, field_selector=f"metadata.name={pod.metadata.name}")
                return all(p.metadata.uid != pod.metadata.uid or p.metadata.deletion_timestamp for p in now.items)

            def stalled_pod_stopped() -> bool:
                posters[0].post(19, 20)  # pod 0 goes on stepping, pod 1 goes on posting without a step
                posters[1].post(1, 20, step=frozen)
                return gone(stall_pods[1])

            wait_for(stalled_pod_stopped, timeout=RECOVERY_SECONDS, interval=1.0, message="the stalled pod deleted")
            dj.wait_events("stall", "Stalled", timeout=RECOVERY_SECONDS)
            assert not gone(stall_pods[0]), "the pod that steps is left alone"
            assert "ProgressUnreachable" not in dj.events("stall")
            # It gave up on calls that hung and tried again meanwhile, on new connections.
            assert proxy.accepted_while_holding > 0
        finally:
            proxied.stop()
            operator.start()
