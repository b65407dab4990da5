#!/usr/bin/env python3
"""Progress pushed to the operator: the server under N posting pods, and what it costs.

    ~/.cache/muralist/venv/bin/python benchmarks/progress_load.py [--variants 128x8 1024x1] [--duration 60]

Three processes, so that neither the posters' CPU nor the bookkeeping counts against the server:

- server (`_serve`): the real ProgressServer over TLS, the real TokenVerifier (its TokenReview
  API is a stub that knows every pod's token, so only the first post of each pod reviews; the pod
  lookup is a dict, as the operator's kopf index is), the real Aggregator, and a status writer
  thread that writes through a counting stub whenever `Aggregator.take` gives it something
  (at most once per second per job). It records each write's time and per-index counts.
- posters (`_post`): one keep-alive aiohttp connection per pod, posting like the runtime: the
  pod's cumulative counts every interval (3 s, or what the server answers), a first post at a
  random offset within the interval, and a final post at the end. Each pod "renders" at
  ranks / image-seconds images per second from its start, so the time every count was reached
  is known exactly.
- this one: starts both, reads the server's CPU time from /proc/<pid>/stat over the measured
  window (after a warm-up that holds the TLS handshakes), and computes status lag: from the
  moment a pod's count reached c to the first status write whose count for that pod is >= c.

Targets: <= 1 status write per second per job, server CPU <= 10 % of one core, lag <= 5 s.

`--baseline-rev REV` also runs REV's server (its copy of this file, from `git archive`) before
each of this tree's runs, fed by the same posters, for `--rounds` rounds: a change to the server
measured side by side. `--coalesce 0` turns off the loop's linger (progress/coalesce.py).

`--operator 1024x1` runs the pushed path through the whole operator instead of the server alone:
the test control plane, a real DiffusionJob of that many pods (kwok plays two GPU nodes: 16
pods run, the rest stay Pending; all are pods the operator indexes and a token can be bound
to), the posters with tokens bound to those pods, and the CPU of the operator's process (kopf,
its watches and indexes, the reconciler's status writes, the endpoint). `--operator-rev REV`
runs REV's operator beside it, interleaved over `--rounds`.

Beside it, the path it replaces (`--configmap 1024x1`, on by default): the test control plane
(hack/controlplane.py) and the operator of the commit before pushed progress
(`--configmap-rev`, extracted with `git archive`, so this tree's code is not involved), one
suspended DiffusionJob (no pods: only progress is measured), and every rank merge-patching its
`rank-<r>` key of the job's progress ConfigMap every 5 s, as that runtime did, each over its own
keep-alive connection with the admin's client certificate. Measured the same way: API-server
writes for that job (ConfigMap patches + status writes), the operator's CPU (the whole
process: kopf's ConfigMap watch is where it goes), and the lag from a count being reached to
the first status (seen by a watch) whose progress.completed includes it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import os
import random
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "api"), str(REPO / "operator"), str(REPO / "runtime")]

NAMESPACE, JOB, SERVICE = "bench", "catalog", "muralist-progress"
SNI = f"{SERVICE}.muralist-system.svc"
CLK_TCK = os.sysconf("SC_CLK_TCK")

from muralist_operator.progress.aggregate import POST_BUDGET_PER_SECOND  # noqa: E402  (after the path)
from muralist_operator.progress.coalesce import COALESCE_SECONDS  # noqa: E402


def token_for(index: int) -> str:
    """A JWT-shaped token, so the verifier's expiry cap runs as it does for real tokens; its last
    segment says which pod it is (see StubTokenReviews)."""
    claims = {"sub": f"pod-{index}", "exp": int(time.time()) + 600}
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{payload}.sig{index}"


# -- the server process ------------------------------------------------------------------------


class StubTokenReviews:
    """AuthenticationV1Api.create_token_review for the benchmark's tokens."""

    def __init__(self, pods: int) -> None:
        self.pods = {f"sig{i}": i for i in range(pods)}

    def create_token_review(self, body: dict[str, Any], **_: Any) -> Any:
        index = self.pods.get(body["spec"]["token"].rsplit(".", 1)[-1])
        if index is None:
            return SimpleNamespace(status=SimpleNamespace(authenticated=False, error="invalid bearer token"))
        user = SimpleNamespace(
            username=f"system:serviceaccount:{NAMESPACE}:default",
            extra={"authentication.kubernetes.io/pod-name": [f"{JOB}-{index}"],
                   "authentication.kubernetes.io/pod-uid": [f"uid-{index}"]},
        )
        return SimpleNamespace(status=SimpleNamespace(authenticated=True, audiences=["muralist.dev"], user=user,
                                                      error=None))


def serve(args: argparse.Namespace) -> int:
    from muralist_operator.progress.aggregate import Aggregator
    from muralist_operator.progress.auth import PodInfo, TokenVerifier
    from muralist_operator.progress.server import ProgressServer
    from muralist_operator.progress.tls import read_mounted

    out = Path(args.dir)
    tls = read_mounted(out)  # as in cert-manager mode
    pods = {(NAMESPACE, f"{JOB}-{i}"): PodInfo(f"{JOB}-{i}", f"uid-{i}", JOB, i, owner_uid="uid-job")
            for i in range(args.pods)}
    verifier = TokenVerifier(StubTokenReviews(args.pods), lambda ns, name: pods.get((ns, name)),
                             lambda ns, name: "uid-job" if (ns, name) == (NAMESPACE, JOB) else None)
    aggregator = Aggregator(post_budget_per_second=args.budget)
    key = (NAMESPACE, JOB)
    wake = threading.Event()
    stop = threading.Event()

    def on_report(namespace: str, job: str, report: Any) -> None:
        aggregator.record((namespace, job), report)
        wake.set()

    writes: list[tuple[float, float, list[int]]] = []  # (asked `take`, snapshot made, per-index counts)
    rates: list[float | None] = []

    def writer() -> None:
        # The integrator's reconcile trigger, reduced to its cost: wait for a report or for the
        # throttle to open, then write what `take` gives.
        while not stop.is_set():
            delay = aggregator.next_due(key)
            if delay is None:  # nothing new: sleep until a report comes
                wake.wait(1.0)
                wake.clear()
                continue
            if delay > 0:  # throttled: one timer, not a wake-up per report
                stop.wait(delay)
                continue
            asked = time.monotonic()
            snap = aggregator.take(key)
            if snap is not None:
                done = [0] * args.pods
                for i, p in snap.indexes.items():
                    done[i] = p.done
                writes.append((asked, time.monotonic(), done))
                rates.append(snap.status_fields()["imagesPerSecond"])  # what would be patched

    # The pod lookup is a dict and the interval a cached number: nothing blocks (as in the operator).
    server = ProgressServer(verifier, on_report, tls, host="127.0.0.1", port=0,
                            interval=lambda ns, job: aggregator.suggested_interval(),
                            lookups_block=args.lookups_block, coalesce=args.coalesce)
    server.start()
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    (out / "port").write_text(str(server.port))
    while not stop.wait(0.2):
        pass
    server.stop()
    thread.join(5)
    (out / "server.json").write_text(json.dumps({
        "writes": writes,
        "responses": dict(server.responses),
        "connections": server.connections_seen,
        "reviews": verifier.reviews,
        "rates": rates,
    }))
    return 0


# -- the posters process -----------------------------------------------------------------------


async def post_all(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    out = Path(args.dir)
    ctx = ssl.create_default_context(cadata=(out / "ca.crt").read_text())
    url = f"https://127.0.0.1:{args.port}/v1/namespaces/{NAMESPACE}/diffusionjobs/{JOB}/progress"
    sni = args.sni or SNI
    # Real pods (run_operator_variant): their names, indexes and bound tokens; otherwise made up.
    who = (json.loads((out / "pods.json").read_text()) if (out / "pods.json").exists() else
           [{"pod": f"{JOB}-{i}", "index": i, "token": token_for(i)} for i in range(args.pods)])
    rate = args.ranks / args.image_seconds  # images per second per pod
    start = time.monotonic()
    end = start + args.duration
    starts = [start + random.uniform(0, args.image_seconds) for _ in range(args.pods)]
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    intervals: Counter[int] = Counter()
    latencies: list[float] = []
    sent: list[float] = []  # when each post went out (CLOCK_MONOTONIC is the machine's: comparable across processes)

    def body(i: int, now: float, final: bool) -> bytes:
        done = max(0, int((now - starts[i]) * rate))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return json.dumps({"pod": who[i]["pod"], "index": who[i]["index"], "attempt": 0, "ranks": args.ranks,
                           "completed": done,
                           "skipped": 0, "failed": 0, "total": 1_000_000, "lastStepTime": stamp,
                           "lastImageTime": stamp, "sentAt": stamp, "final": final}).encode()

    async def pod(i: int) -> None:
        headers = {"Authorization": f"Bearer {who[i]['token']}", "Content-Type": "application/json"}
        connector = aiohttp.TCPConnector(limit=1, ssl=ctx, keepalive_timeout=300)
        interval = 3.0
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.sleep(random.uniform(0, interval))
            while True:
                now = time.monotonic()
                final = now >= end
                t0 = time.monotonic()
                sent.append(t0)
                try:
                    async with session.post(url, data=body(i, now, final), headers=headers,
                                            server_hostname=sni) as resp:
                        statuses[resp.status] += 1
                        if resp.status == HTTPStatus.OK:
                            interval = float((await resp.json())["intervalSeconds"])
                        elif resp.status == HTTPStatus.NO_CONTENT:
                            interval = 3.0
                        else:
                            await resp.read()
                        intervals[interval] += 1
                except (aiohttp.ClientError, TimeoutError) as e:
                    errors[type(e).__name__] += 1
                latencies.append(time.monotonic() - t0)
                if final:
                    return
                await asyncio.sleep(max(0.0, min(interval, end - time.monotonic() + 0.001)))

    await asyncio.gather(*(pod(i) for i in range(args.pods)))
    latencies.sort()
    return {"starts": starts, "rate": rate, "start": start, "end": end, "statuses": dict(statuses),
            "errors": dict(errors), "intervals": dict(intervals), "sent": sent,
            "latency_p50": latencies[len(latencies) // 2], "latency_p95": latencies[int(len(latencies) * 0.95)]}


def post(args: argparse.Namespace) -> int:
    result = asyncio.run(post_all(args))
    Path(args.dir, "posters.json").write_text(json.dumps(result))
    return 0


# -- the orchestrator --------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15)


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def lags(posters: dict[str, Any], writes: list[tuple[float, list[int]]], since: float, until: float) -> list[float]:
    """For every count c that pod i reached in [since, until]: first write with done[i] >= c, minus that moment."""
    rate, out = posters["rate"], []
    for i, started in enumerate(posters["starts"]):
        w = 0
        c = max(1, int((since - started) * rate) + 1)
        while True:
            reached = started + c / rate
            if reached > until:
                break
            while w < len(writes) and (writes[w][0] < reached or writes[w][1][i] < c):
                w += 1
            if w == len(writes):
                break
            out.append(writes[w][0] - reached)
            c += 1
    return sorted(out)


def archived_tree(rev: str, into: Path, *paths: str) -> Path:
    """`paths` of the repository as they were at `rev` (git archive), under `into`; paths that
    `rev` does not have (api/ before the API package) are left out."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", rev, *paths], check=True,
                            capture_output=True, text=True).stdout.split()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, *listed], check=True, capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def baseline_tree(rev: str, into: Path) -> Path:
    """This benchmark and the operator as they were at `rev`: its `_serve` runs that commit's
    server, fed by this tree's posters."""
    return archived_tree(rev, into, "benchmarks", "api", "operator", "runtime") / "benchmarks" / "progress_load.py"


OPERATOR_PATHS = ("api", "cli", "operator", "runtime", "crds")


def start_operator(tree: Path, kubeconfig: Path, log_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Any]:
    """`tree`'s CRD applied and its operator started against the test control plane (in a
    process group of its own): the process and an API client."""
    import yaml
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))
    crd = yaml.safe_load((tree / "crds" / "muralist.dev_diffusionjobs.yaml").read_text())
    client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig),
           "PYTHONPATH": os.pathsep.join(str(tree / d) for d in ("api", "cli", "operator", "runtime"))}
    with open(log_path, "wb") as log:  # the child keeps its own descriptor
        operator = subprocess.Popen([sys.executable, "-m", "muralist_cli", "operator", "--health-port", "0",
                                     "--metrics-port", "0", *extra], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    return operator, api


@dataclass(frozen=True)
class Window:
    """The measured part of a run: after the warm-up until the posters are done."""

    start: float
    end: float
    cpu: float  # seconds of CPU of the measured process(es) in it
    load: tuple[Any, Any]  # os.getloadavg() before and after the run

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def holds(self, moment: float) -> bool:
        return self.start <= moment <= self.end


def measured(role: str, role_args: list[str], cpu: Any, args: argparse.Namespace) -> Window:
    """Run the posters (this file's `role`) to the end; `cpu()` is read after the warm-up and at the end."""
    load_before = os.getloadavg()
    posters = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), role, *role_args,
                                "--duration", str(args.duration), "--image-seconds", str(args.image_seconds)])
    time.sleep(args.warmup)
    cpu0, start = cpu(), time.monotonic()
    posters.wait()
    cpu1, end = cpu(), time.monotonic()
    return Window(start, end, cpu1 - cpu0, (load_before, os.getloadavg()))


def lag_and_posts(pst: dict[str, Any], lag: list[float]) -> dict[str, Any]:
    """What every row says of the lag (sorted) and of the posts as the posters saw them."""
    return {
        "lag_p50": percentile(lag, 0.50),
        "lag_p95": percentile(lag, 0.95),
        "lag_max": lag[-1] if lag else float("nan"),
        "lag_samples": len(lag),
        "post_p50_ms": 1000 * pst["latency_p50"],
        "post_p95_ms": 1000 * pst["latency_p95"],
        "non_2xx": {k: v for k, v in pst["statuses"].items() if not k.startswith("2")} | pst["errors"],
    }


def run_variant(pods: int, ranks: int, args: argparse.Namespace, server_script: Path | None = None,
                label: str = "this tree") -> dict[str, Any]:
    """One load run; `server_script`: another commit's copy of this file (baseline_tree) serves."""
    from muralist_operator.progress.tls import issue, new_ca, service_names

    me = Path(__file__).resolve()
    server_args = ["--budget", str(args.budget), *(["--lookups-block"] if args.lookups_block else [])]
    if server_script is None:
        server_script = me
        server_args += ["--coalesce", str(args.coalesce)]
    with tempfile.TemporaryDirectory(prefix="muralist-progress-bench-") as tmp:
        out = Path(tmp)
        ca_pem, ca_key = new_ca()
        material = issue(service_names(SERVICE, "muralist-system"), ca_pem, ca_key)
        (out / "tls.crt").write_bytes(material.cert_pem)
        (out / "tls.key").write_bytes(material.key_pem)
        (out / "ca.crt").write_bytes(ca_pem)
        common = ["--dir", tmp, "--pods", str(pods), "--ranks", str(ranks)]
        server = subprocess.Popen([sys.executable, str(server_script), "_serve", *common, *server_args])
        port_file = out / "port"
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server process did not start")
            time.sleep(0.05)
        window = measured("_post", [*common, "--port", port_file.read_text()], lambda: cpu_seconds(server.pid), args)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        srv = json.loads((out / "server.json").read_text())
        pst = json.loads((out / "posters.json").read_text())
    # Gaps between writes from the moments `take` said yes (the throttle's promise); lag from the
    # moments the snapshot was made (when the status to write held the count).
    asked = [a for a, _, _ in srv["writes"]]
    writes = [(t, done) for _, t, done in srv["writes"]]
    in_window = [t for t in asked if window.holds(t)]
    gaps = [b - a for a, b in itertools.pairwise(in_window)]
    last_rate = [r for (t, _), r in zip(writes, srv["rates"], strict=True) if t <= pst["end"]][-1]
    # Counts reached after the last full interval cannot be in any write yet: leave them out.
    lag = lags(pst, writes, since=window.start, until=pst["end"] - 2 * max(float(k) for k in pst["intervals"]))
    requests = sum(pst["statuses"].values())
    posts_in_window = sum(1 for t in pst["sent"] if window.holds(t))
    return {
        "variant": f"{pods} pods x {ranks} ranks",
        "server": label,
        "cpu_ms_per_post": 1000 * window.cpu / max(1, posts_in_window),
        "interval": float(max(pst["intervals"], key=lambda k: pst["intervals"][k])),  # what most posts were told
        "requests_per_second": requests / (pst["end"] - pst["start"]),
        "writes_per_second": len(gaps) / sum(gaps) if gaps else 0.0,
        "min_write_gap": min(gaps, default=float("nan")),
        "cpu_percent": 100 * window.cpu / window.seconds,
        **lag_and_posts(pst, lag),
        "reviews": srv["reviews"],
        "connections": srv["connections"],
        "images_per_second": last_rate,
        "expected_images_per_second": pods * ranks / args.image_seconds,
        "load": window.load,
    }


# -- today's path: ranks patching the progress ConfigMap, the previous operator summing it -------

CM_INTERVAL_SECONDS = 5.0  # the ConfigMap reporter's PATCH_INTERVAL_SECONDS


def kube_endpoint(kubeconfig: Path) -> tuple[str, str, str, str]:
    """(server, CA file, client certificate, client key) of the test control plane's admin."""
    doc = json.loads(kubeconfig.read_text())
    cluster, user = doc["clusters"][0]["cluster"], doc["users"][0]["user"]
    return cluster["server"], cluster["certificate-authority"], user["client-certificate"], user["client-key"]


async def cm_post_all(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    server, ca, cert, key = kube_endpoint(Path(args.kubeconfig))
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    url = f"{server}/api/v1/namespaces/{NAMESPACE}/configmaps/{JOB}-progress"
    rate = 1 / args.image_seconds  # images per second per rank
    start = time.monotonic()
    end = start + args.duration
    starts = [start + random.uniform(0, args.image_seconds) for _ in range(args.ranks)]
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    ok_times: list[float] = []

    def body(r: int, now: float) -> bytes:
        done = max(0, int((now - starts[r]) * rate))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        value = {"attempt": 0, "completed": done, "skipped": 0, "failed": 0, "total": 1_000_000 // args.ranks,
                 "lastStepTime": stamp, "lastImageTime": stamp, "heartbeatTime": stamp}
        return json.dumps({"data": {f"rank-{r}": json.dumps(value)}}).encode()

    async def rank(r: int) -> None:
        headers = {"Content-Type": "application/merge-patch+json"}
        connector = aiohttp.TCPConnector(limit=1, ssl=ctx, keepalive_timeout=300)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
            await asyncio.sleep(random.uniform(0, CM_INTERVAL_SECONDS))
            while time.monotonic() < end:
                t0 = time.monotonic()
                try:
                    async with session.patch(url, data=body(r, t0), headers=headers) as resp:
                        await resp.read()
                        statuses[resp.status] += 1
                        if resp.status < 300:
                            ok_times.append(time.monotonic())
                except (aiohttp.ClientError, TimeoutError) as e:
                    errors[type(e).__name__] += 1
                latencies.append(time.monotonic() - t0)
                # Like the reporter: a fixed wait after each patch, whatever the patch took.
                await asyncio.sleep(CM_INTERVAL_SECONDS)

    await asyncio.gather(*(rank(r) for r in range(args.ranks)))
    latencies.sort()
    return {"starts": starts, "rate": rate, "start": start, "end": end, "statuses": dict(statuses),
            "errors": dict(errors), "ok_times": ok_times,
            "latency_p50": latencies[len(latencies) // 2], "latency_p95": latencies[int(len(latencies) * 0.95)]}


def cm_post(args: argparse.Namespace) -> int:
    result = asyncio.run(cm_post_all(args))
    Path(args.dir, "posters.json").write_text(json.dumps(result))
    return 0


def true_totals(starts: list[float], rate: float, until: float) -> list[float]:
    """When the job's true total reached 1, 2, 3, ... images (every rank renders at `rate`)."""
    times = [s + k / rate for s in starts for k in range(1, int((until - s) * rate) + 1)]
    return sorted(times)


def cm_lags(posters: dict[str, Any], statuses: list[tuple[float, int]], since: float, until: float) -> list[float]:
    reached = true_totals(posters["starts"], posters["rate"], until)
    out, w = [], 0
    for c, moment in enumerate(reached, start=1):
        if moment < since:
            continue
        while w < len(statuses) and (statuses[w][0] < moment or statuses[w][1] < c):
            w += 1
        if w == len(statuses):
            break
        out.append(statuses[w][0] - moment)
    return sorted(out)


def process_cpu(pid: int) -> float:
    total = 0.0
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            pids += [int(c) for c in (task / "children").read_text().split()]
    for p in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
    return total


def watch_progress(custom: Any, statuses: list[tuple[float, int]], stop: threading.Event) -> None:
    """Append (seen, status.progress.completed) for every change of the job until `stop`."""
    from kubernetes import watch

    version = None
    while not stop.is_set():
        try:
            for event in watch.Watch().stream(custom.list_namespaced_custom_object, "muralist.dev", "v1alpha1",
                                              NAMESPACE, "diffusionjobs", resource_version=version,
                                              timeout_seconds=60):
                obj = event["object"]
                version = obj["metadata"]["resourceVersion"]
                done = ((obj.get("status") or {}).get("progress") or {}).get("completed", 0)
                if not statuses or statuses[-1][1] != int(done) or event["type"] == "MODIFIED":
                    statuses.append((time.monotonic(), int(done)))
                if stop.is_set():
                    return
        except Exception:  # a loaded API server drops watches now and then: list and watch again
            version = None
            time.sleep(0.2)


def stop_process_group(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def create_when_served(custom: Any, body: dict[str, Any], deadline: float) -> None:
    """Create the DiffusionJob; the CRD is served a moment after it is created."""
    from kubernetes import client

    while True:
        try:
            custom.create_namespaced_custom_object("muralist.dev", "v1alpha1", NAMESPACE, "diffusionjobs", body)
            return
        except client.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def run_configmap_variant(pods: int, ranks: int, args: argparse.Namespace) -> dict[str, Any]:
    """1,024 ranks (pods x ranks) through the progress ConfigMap and the previous operator."""
    sys.path.insert(0, str(REPO / "hack"))
    import controlplane  # hack/controlplane.py
    from kubernetes import client

    total_ranks = pods * ranks
    with tempfile.TemporaryDirectory(prefix="muralist-progress-cm-") as tmp:
        work = Path(tmp)
        old = archived_tree(args.configmap_rev, work / "old", *OPERATOR_PATHS)
        cp = controlplane.ControlPlane(controlplane.default_bin_dir(), work / "cluster")
        cp.start()
        operator: subprocess.Popen[bytes] | None = None
        try:
            operator, api = start_operator(old, cp.kubeconfig, work / "operator.log")
            core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            dj = {"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob", "metadata": {"name": JOB},
                  "spec": {"model": {"name": "muralist/tiny-flux"},
                           "promptsFrom": {"configMapKeyRef": {"name": "prompts", "key": "prompts.txt"}},
                           "parallelism": {"nodes": pods, "gpusPerNode": 0, "processesPerNode": ranks},
                           "output": {"volume": {"persistentVolumeClaim": {"claimName": "results"}}},
                           "runPolicy": {"suspend": True}}}
            deadline = time.monotonic() + 60
            create_when_served(custom, dj, deadline)
            while True:  # the operator creates the progress ConfigMap with the job's other children
                try:
                    core.read_namespaced_config_map(f"{JOB}-progress", NAMESPACE)
                    break
                except client.ApiException:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"no progress ConfigMap from the old operator: {work}/operator.log") from None
                    time.sleep(0.5)

            statuses: list[tuple[float, int]] = []  # (seen, status.progress.completed)
            stop = threading.Event()
            threading.Thread(target=watch_progress, args=(custom, statuses, stop), daemon=True).start()
            pid = operator.pid
            window = measured("_cmpost", ["--dir", tmp, "--ranks", str(total_ranks), "--kubeconfig",
                                          str(cp.kubeconfig)], lambda: process_cpu(pid), args)
            time.sleep(2 * CM_INTERVAL_SECONDS)  # what the operator still had queued
            stop.set()
            pst = json.loads((work / "posters.json").read_text())
        finally:
            stop_process_group(operator)
            cp.stop()
    patches = sum(1 for t in pst["ok_times"] if window.holds(t))
    # The job's spec never changes here: every event after the first is a status write.
    changes = [t for t, _ in statuses[1:] if window.holds(t)]
    seconds = window.seconds
    lag = cm_lags(pst, statuses, since=window.start, until=pst["end"] - 2 * CM_INTERVAL_SECONDS)
    requests = sum(pst["statuses"].values())
    return {
        "variant": f"{pods} pods x {ranks} ranks",
        "path": f"ConfigMap (operator at {args.configmap_rev})",
        "interval": int(CM_INTERVAL_SECONDS),
        "requests_per_second": requests / (pst["end"] - pst["start"]),
        "api_writes_per_second": (patches + len(changes)) / seconds,
        "writes_per_second": len(changes) / seconds,
        "cpu_percent": 100 * window.cpu / seconds,
        **lag_and_posts(pst, lag),
        "load": window.load,
    }


# -- the pushed path through the whole operator ----------------------------------------------------


def run_operator_variant(pods: int, ranks: int, args: argparse.Namespace, rev: str | None = None) -> dict[str, Any]:
    """The pushed path through this tree's whole operator (kopf, its indexes, the reconciler's
    status writes, the endpoint), or REV's (git archive): a DiffusionJob of `pods` pods on the
    test control plane, whose pods kwok plays (those that fit stay Running, the rest Pending: all
    are objects the operator indexes and a token can be bound to), posted for with tokens bound
    to them."""
    sys.path.insert(0, str(REPO / "hack"))
    import controlplane  # hack/controlplane.py
    from kubernetes import client
    from muralist_api import contract

    with tempfile.TemporaryDirectory(prefix="muralist-progress-op-") as tmp:
        work = Path(tmp)
        tree = REPO if rev is None else archived_tree(rev, work / "tree", *OPERATOR_PATHS)
        cp = controlplane.ControlPlane(controlplane.default_bin_dir(), work / "cluster")
        cp.start()
        operator: subprocess.Popen[bytes] | None = None
        try:
            port = controlplane.free_port()
            operator, api = start_operator(tree, cp.kubeconfig, work / "operator.log", "--operator-namespace",
                                           "default", "--progress-port", str(port), "--progress-url",
                                           f"https://localhost:{port}", "--progress-tls-name", "localhost")
            core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            # promptsFrom: the operator does not know the total, so the pods' (1,000,000) stands.
            core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "prompts"},
                                                          "data": {"prompts.txt": "a prompt\n"}})
            dj = {"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob", "metadata": {"name": JOB},
                  "spec": {"model": {"name": "muralist/tiny-flux"},
                           "promptsFrom": {"configMapKeyRef": {"name": "prompts", "key": "prompts.txt"}},
                           "parallelism": {"nodes": pods, "gpusPerNode": ranks},
                           "output": {"volume": {"persistentVolumeClaim": {"claimName": "results"}}},
                           "podTemplate": {"annotations": {"fate.muralist.dev/outcome": "run"}}}}
            create_when_served(custom, dj, time.monotonic() + 60)
            selector = f"muralist.dev/job-name={JOB}"
            deadline = time.monotonic() + 600
            while len(found := core.list_namespaced_pod(NAMESPACE, label_selector=selector).items) < pods:
                if time.monotonic() > deadline or operator.poll() is not None:
                    raise SystemExit(f"{len(found)} of {pods} pods after 600 s: {work}/operator.log")
                time.sleep(2)
            spec_map = core.read_namespaced_config_map(f"{JOB}-spec", NAMESPACE)
            (work / "ca.crt").write_text(spec_map.data[contract.PROGRESS_CA_KEY])
            who = []
            for pod in found:
                bound = {"audiences": [contract.PROGRESS_AUDIENCE], "expirationSeconds": 3600,
                         "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
                                            "uid": pod.metadata.uid}}
                account = pod.spec.service_account_name or "default"
                token = core.create_namespaced_service_account_token(account, NAMESPACE, {"spec": bound}).status.token
                index = int(pod.metadata.annotations[contract.COMPLETION_INDEX_ANNOTATION])
                who.append({"pod": pod.metadata.name, "index": index, "token": token})
            (work / "pods.json").write_text(json.dumps(sorted(who, key=lambda w: w["index"])))
            statuses: list[tuple[float, int]] = []
            stop = threading.Event()
            threading.Thread(target=watch_progress, args=(custom, statuses, stop), daemon=True).start()
            time.sleep(5)  # the pods' events settle (kwok starting the ones that fit)
            pid = operator.pid
            window = measured("_post", ["--dir", tmp, "--pods", str(pods), "--ranks", str(ranks), "--port", str(port),
                                        "--sni", "localhost"], lambda: process_cpu(pid), args)
            time.sleep(3)  # the last status write
            stop.set()
            pst = json.loads((work / "posters.json").read_text())
        finally:
            stop_process_group(operator)
            cp.stop()
    changes = [t for t, _ in statuses[1:] if window.holds(t)]
    seconds = window.seconds
    told = max(float(k) for k in pst["intervals"])
    lag = cm_lags(pst, statuses, since=window.start, until=pst["end"] - 2 * told)
    return {
        "variant": f"{pods} pods x {ranks} ranks",
        "path": f"pushed, the whole operator ({rev or 'this tree'})",
        "interval": float(max(pst["intervals"], key=lambda k: pst["intervals"][k])),
        "requests_per_second": sum(pst["statuses"].values()) / (pst["end"] - pst["start"]),
        "api_writes_per_second": len(changes) / seconds,  # status writes (TokenReviews aside)
        "writes_per_second": len(changes) / seconds,
        "cpu_percent": 100 * window.cpu / seconds,
        **lag_and_posts(pst, lag),
        "load": window.load,
    }


def comparison(rows: list[dict[str, Any]]) -> str:
    """The two paths side by side: what each costs the API server and the operator, and the lag."""
    head = ("| path | variant | posts/s | API-server writes/s for the job | of which status writes/s | "
            "operator CPU (% of a core) | status lag p50 / p95 / max (s) | post latency p50 / p95 (ms) | "
            "refused/errors | load avg before -> after |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['path']} | {r['variant']} | {r['requests_per_second']:.0f} | {r['api_writes_per_second']:.2f} | "
            f"{r['writes_per_second']:.2f} | {r['cpu_percent']:.1f} | "
            f"{r['lag_p50']:.2f} / {r['lag_p95']:.2f} / {r['lag_max']:.2f} | "
            f"{r['post_p50_ms']:.1f} / {r['post_p95_ms']:.1f} | {r['non_2xx'] or 'none'} | "
            f"{' '.join(f'{x:.2f}' for x in r['load'][0])} -> {' '.join(f'{x:.2f}' for x in r['load'][1])} |"
        )
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| server | variant | interval told (s) | requests/s | status writes/s | server CPU (% of a core) | "
            "CPU per post (ms) | "
            "min gap between writes (s) | lag p50 / p95 / max (s) | post latency p50 / p95 (ms) | TokenReviews | "
            "connections | refused/errors | images/s aggregated (expected) | load avg before -> after |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['server']} | {r['variant']} | {r['interval']:g} | {r['requests_per_second']:.0f} | "
            f"{r['writes_per_second']:.2f} | {r['cpu_percent']:.1f} | {r['cpu_ms_per_post']:.3f} | "
            f"{r['min_write_gap']:.2f} | "
            f"{r['lag_p50']:.2f} / {r['lag_p95']:.2f} / {r['lag_max']:.2f} | "
            f"{r['post_p50_ms']:.1f} / {r['post_p95_ms']:.1f} | {r['reviews']} | {r['connections']} | "
            f"{r['non_2xx'] or 'none'} | {r['images_per_second']} ({r['expected_images_per_second']:.0f}) | "
            f"{' '.join(f'{x:.2f}' for x in r['load'][0])} -> {' '.join(f'{x:.2f}' for x in r['load'][1])} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="run", choices=["run", "_serve", "_post", "_cmpost"])
    parser.add_argument("--variants", nargs="*", default=["128x8", "1024x1"], help="PODSxRANKS (none: skip)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of posting per variant")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds left out of the CPU figure")
    parser.add_argument("--image-seconds", type=float, default=4.0, help="seconds per image per rank")
    parser.add_argument("--budget", type=float, default=POST_BUDGET_PER_SECOND,
                        help="posts/s the server asks pods to stay within")
    parser.add_argument("--coalesce", type=float, default=COALESCE_SECONDS,
                        help="seconds the server's loop lingers after a wake-up (0: off)")
    parser.add_argument("--baseline-rev", metavar="REV",
                        help="also run the server of this commit beside this tree's, interleaved (e.g. cf2fd41)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every variant (interleaved with the baseline)")
    parser.add_argument("--lookups-block", action="store_true",
                        help="verify every post on a worker thread, as with blocking lookups")
    parser.add_argument("--configmap", nargs="*", default=["1024x1"], metavar="PODSxRANKS",
                        help="the same load through the progress ConfigMap and the previous operator (none: skip)")
    parser.add_argument("--configmap-rev", default="3e0854c",
                        help="the commit whose operator sums the progress ConfigMap (before pushed progress)")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--dir")
    parser.add_argument("--pods", type=int)
    parser.add_argument("--ranks", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--sni")
    parser.add_argument("--operator", nargs="*", default=[], metavar="PODSxRANKS",
                        help="the same load through this tree's whole operator, its pods real objects of a "
                             "real DiffusionJob on the test control plane, their tokens bound to them")
    parser.add_argument("--operator-rev", metavar="REV",
                        help="--operator also through this commit's operator, interleaved over --rounds")
    args = parser.parse_args()
    if args.role == "_serve":
        return serve(args)
    if args.role == "_post":
        return post(args)
    if args.role == "_cmpost":
        return cm_post(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="muralist-progress-baseline-") as tmp:
        baseline = baseline_tree(args.baseline_rev, Path(tmp)) if args.baseline_rev else None
        for _ in range(args.rounds):
            for variant in args.variants:
                pods, ranks = (int(x) for x in variant.split("x"))
                if baseline is not None:
                    rows.append(run_variant(pods, ranks, args, baseline, label=args.baseline_rev))
                    print(json.dumps(rows[-1], default=str), file=sys.stderr)
                rows.append(run_variant(pods, ranks, args))
                print(json.dumps(rows[-1], default=str), file=sys.stderr)
    side_by_side = []
    for _ in range(args.rounds if args.operator else 0):
        for variant in args.operator:
            pods, ranks = (int(x) for x in variant.split("x"))
            for rev in ([args.operator_rev] if args.operator_rev else []) + [None]:
                side_by_side.append(run_operator_variant(pods, ranks, args, rev))
                print(json.dumps(side_by_side[-1], default=str), file=sys.stderr)
    for variant in args.configmap:
        pods, ranks = (int(x) for x in variant.split("x"))
        name = f"{pods} pods x {ranks} ranks"
        pushed = next((r for r in rows if r["variant"] == name and r["server"] == "this tree"), None)
        if pushed is not None:
            side_by_side.append({**pushed, "path": "pushed (this tree)",
                                 "api_writes_per_second": pushed["writes_per_second"]})
        side_by_side.append(run_configmap_variant(pods, ranks, args))
        print(json.dumps(side_by_side[-1], default=str), file=sys.stderr)
    print(f"\n{os.cpu_count()} CPUs; {args.duration:.0f} s of posting per variant, CPU after {args.warmup:.0f} s "
          f"warm-up; {args.image_seconds} s per image per rank; post budget {args.budget:.0f}/s; "
          f"verification {'always on worker threads' if args.lookups_block else 'inline when the token is cached'}\n")
    print(table(rows))
    if side_by_side:
        print(f"\nThe same load through a whole operator on the test control plane: pushed (--operator, a real "
              "job's pods and bound tokens) and through the progress ConfigMap (every rank patches its key every "
              f"{CM_INTERVAL_SECONDS:.0f} s; the operator watches the ConfigMap and writes status). API-server writes: "
              "the status writes (TokenReviews aside), plus the patches for the ConfigMap; CPU: the operator's "
              "process, kopf included; lag: to the first status whose progress.completed includes the count. "
              "'pushed (this tree)' is the server-only run above, for reference.\n")
        print(comparison(side_by_side))
    print(f"\n`uptime`: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
