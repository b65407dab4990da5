#!/usr/bin/env python3
"""Operator scale: N DiffusionJobs at once against a real control plane, and the floor.

    ~/.cache/muralist/venv/bin/python benchmarks/operator_scale.py [--sizes 1 50 200] [--rounds 3] [--quick]

Starts the test control plane (hack/controlplane.py: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok) in a temp dir with 4 fake nodes (110 pods
each), applies the CRD, runs `muralist operator` as a subprocess (as tests/cluster/conftest.py
does), then for each N, `--rounds` rounds of both of these, each in a fresh namespace, the
order alternating from round to round (operator first in odd rounds, floor first in even ones)
so that drift in the machine's load hits both alike:

- operator: create N one-pod DiffusionJobs at once (8 client threads; CPU, tiny requests; the
  pods' fate `succeed` after 2 s, played by kwok's stages) and wait until all are Succeeded;
- floor: create N plain Indexed Jobs (same pod fate, no operator) and wait until all complete.

Times are local receive times of watch events (monotonic clock, sub-millisecond), measured
from just before each create request is sent:

- DJ create -> its Job exists; DJ create -> its pod exists (operator path);
- Job create -> its pod exists (floor: the Job controller alone);
- last pod Succeeded -> DJ phase Succeeded (includes the Job controller marking the Job
  Complete, then the operator); and, for reference, pod Succeeded -> Job Complete (floor).

Every column of the table is printed by the script: latencies pooled over the rounds (p50 /
p95 / max), the ratio of the p50s of DJ create -> pod and the floor's Job create -> pod (median
of the rounds, and each round's), the time until all N are done and how long the creates took
to send (medians), the operator's CPU seconds during its round and the namespace's deletion
(median), and its memory: VmHWM (peak RSS) of the operator process and its children, after the N's
last round.

--quick: N = 3, 1 round, no warm-up job (a check that it runs: the test suite runs it, marked
`cluster`; its round includes the operator's start).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config, watch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))
sys.path.insert(0, str(REPO))

import controlplane  # noqa: E402  (hack/controlplane.py)
from muralist_api import GROUP, PLURAL, VERSION  # noqa: E402

from tests.builders import make_job  # noqa: E402
from tests.operator_helpers import free_port  # noqa: E402

CRD_FILE = REPO / "crds" / "muralist.dev_diffusionjobs.yaml"
NODES = tuple(f"kwok-gpu-{i}" for i in range(4))  # 440 pod slots: a round of 200 and leftovers
LABEL_JOB = "muralist.dev/job-name"  # operator children (Job, pods)
LABEL_BATCH_JOB = "batch.kubernetes.io/job-name"  # the Job controller's pod label
FATE = {"fate.muralist.dev/outcome": "succeed", "fate.muralist.dev/after": "2s"}
RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"}}
CREATE_THREADS = 8

Key = tuple[str, str]


# --------------------------------------------------------------------------- event recording


@dataclass
class Recorder:
    """First-seen times (time.monotonic) of what the watches report, keyed by (namespace, owner).

    The owner is the DiffusionJob for operator children, else the Job's own name."""

    job_added: dict[Key, float] = field(default_factory=dict)
    job_complete: dict[Key, float] = field(default_factory=dict)
    pod_added: dict[Key, float] = field(default_factory=dict)
    pod_done: dict[Key, float] = field(default_factory=dict)  # last pod of the owner Succeeded
    dj_succeeded: dict[Key, float] = field(default_factory=dict)
    dj_added: dict[Key, float] = field(default_factory=dict)
    _pods_done: set[tuple[str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_job(self, kind: str, job: dict[str, Any], now: float) -> None:
        meta = job["metadata"]
        key = (meta["namespace"], (meta.get("labels") or {}).get(LABEL_JOB, meta["name"]))
        with self.lock:
            self.job_added.setdefault(key, now)
            conditions = (job.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Complete" and c["status"] == "True" for c in conditions):
                self.job_complete.setdefault(key, now)

    def on_pod(self, kind: str, pod: dict[str, Any], now: float) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        owner = labels.get(LABEL_JOB) or labels.get(LABEL_BATCH_JOB)
        if owner is None:
            return
        key = (meta["namespace"], owner)
        with self.lock:
            self.pod_added.setdefault(key, now)
            pod_id = (meta["namespace"], meta["name"])
            if (pod.get("status") or {}).get("phase") == "Succeeded" and pod_id not in self._pods_done:
                self._pods_done.add(pod_id)
                self.pod_done[key] = now  # one pod per job here; the latest one wins

    def on_dj(self, kind: str, dj: dict[str, Any], now: float) -> None:
        with self.lock:
            self.dj_added.setdefault((dj["metadata"]["namespace"], dj["metadata"]["name"]), now)
        if (dj.get("status") or {}).get("phase") == "Succeeded":
            meta = dj["metadata"]
            with self.lock:
                self.dj_succeeded.setdefault((meta["namespace"], meta["name"]), now)


class Watcher(threading.Thread):
    """One cluster-wide watch (raw JSON, no model deserialisation), restarted on expiry."""

    def __init__(self, kubeconfig: Path, list_fn: Callable[[Any], Callable[..., Any]],
                 handle: Callable[[str, dict[str, Any], float], None]):
        super().__init__(daemon=True)
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.list_fn, self.handle = list_fn, handle
        self.stopped = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        import json

        fn = self.list_fn(self.api)
        while not self.stopped.is_set():
            try:
                listing = json.loads(fn(_preload_content=False).data)
            except (client.ApiException, urllib3.exceptions.HTTPError) as e:
                # A busy API server can time a list out (504, seen at N=200): list again, a second later.
                print(f"  watch list failed ({getattr(e, 'status', type(e).__name__)}), listing again", flush=True)
                self.stopped.wait(1.0)
                continue
            rv = listing["metadata"]["resourceVersion"]
            now = time.monotonic()
            for obj in listing["items"]:  # what changed while no watch was open
                self.handle("LISTED", obj, now)
            self.ready.set()
            w = watch.Watch()
            try:
                for event in w.stream(fn, resource_version=rv, timeout_seconds=60,
                                      allow_watch_bookmarks=False, _preload_content=False):
                    now = time.monotonic()
                    obj = event["raw_object"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.handle(event["type"], obj, now)
                    if self.stopped.is_set():
                        break
            except client.ApiException as e:
                if e.status != 410 and not self.stopped.is_set():  # 410: expired, list again
                    raise
            except urllib3.exceptions.HTTPError:
                if not self.stopped.is_set():  # a dropped stream: list and watch again
                    continue


def watchers(kubeconfig: Path, rec: Recorder) -> list[Watcher]:
    return [
        Watcher(kubeconfig, lambda a: client.BatchV1Api(a).list_job_for_all_namespaces, rec.on_job),
        Watcher(kubeconfig, lambda a: client.CoreV1Api(a).list_pod_for_all_namespaces, rec.on_pod),
        Watcher(kubeconfig,
                lambda a: lambda **kw: client.CustomObjectsApi(a).list_cluster_custom_object(
                    GROUP, VERSION, PLURAL, **kw),
                rec.on_dj),
    ]


# --------------------------------------------------------------------------- the operator


class Operator:
    """`muralist operator` as a subprocess (like tests/cluster/conftest.py's OperatorProcess)."""

    def __init__(self, kubeconfig: Path, log: Path):
        self.log = open(log, "wb")  # noqa: SIM115 (owned by the process)
        port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "muralist_cli", "operator", "--health-port", "0",
             "--metrics-port", "0", "--runtime-image", "muralist-runtime:bench",
             # The progress endpoint as in production (its certificate made at start), on a free port.
             "--progress-port", str(port), "--progress-url", f"https://localhost:{port}",
             "--progress-tls-name", "localhost"],
            stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)}, start_new_session=True)

    def cpu_seconds(self) -> float:
        """User + system CPU of the operator and its descendants so far."""
        total = 0.0
        for pid in process_tree(self.proc.pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def peak_rss_mib(self) -> float:
        """VmHWM of the operator and its descendants (MiB)."""
        return sum(status_kib(pid, "VmHWM") for pid in process_tree(self.proc.pid)) / 1024

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def process_tree(pid: int) -> Iterator[int]:
    yield pid
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            yield from process_tree(int(child))


def status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# --------------------------------------------------------------------------- rounds


def dj_manifest(name: str, namespace: str) -> dict[str, Any]:
    return (make_job(name, namespace).world(nodes=1, gpus=0, processes=1)
            .pod_template(annotations=dict(FATE)).set("spec.resources", RESOURCES).obj())


def plain_job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed", "completions": 1, "parallelism": 1, "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": dict(FATE)},
                "spec": {"restartPolicy": "Never", "containers": [
                    {"name": "worker", "image": "muralist-runtime:bench", "command": ["true"],
                     "resources": RESOURCES}]},
            },
        },
    }


def rendered_job(name: str, namespace: str) -> dict[str, Any]:
    """The Job the operator would create for dj_manifest(name), without the operator: the
    floor of the Job controller for exactly our Job (per-index retries, podFailurePolicy)."""
    from muralist_api.rules.problems import parse_job
    from muralist_operator.render import render_job
    from muralist_operator.settings import OperatorSettings

    job = render_job(parse_job(dj_manifest(name, namespace)), namespace,
                     OperatorSettings(runtime_image="muralist-runtime:bench"))
    job["metadata"] = {"name": name, "namespace": namespace}
    return job


def create_all(count: int, create: Callable[[int], None], over: float = 0.0) -> dict[int, float]:
    """Create `count` objects with a few threads, the i-th no sooner than i/count of `over`
    seconds from now; returns each one's send time."""
    sent: dict[int, float] = {}
    begin = time.monotonic()

    def one(i: int) -> None:
        time.sleep(max(0.0, begin + over * i / count - time.monotonic()))
        sent[i] = time.monotonic()
        create(i)

    with concurrent.futures.ThreadPoolExecutor(CREATE_THREADS) as pool:
        list(pool.map(one, range(count)))
    return sent


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def fresh_namespace(api: Any, name: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    # Pods of a fresh namespace wait for its default ServiceAccount: not what we measure.
    wait_until(lambda: bool(core.list_namespaced_service_account(name).items), 60,
               f"ServiceAccount {name}/default")


def delete_namespace(api: Any, name: str) -> None:
    core = client.CoreV1Api(api)
    core.delete_namespace(name)

    def gone() -> bool:
        try:
            core.read_namespace(name)
            return False
        except client.ApiException as e:
            return e.status == 404

    wait_until(gone, 180, f"namespace {name} to be deleted")


def deltas(start: dict[Key, float], end: dict[Key, float], keys: list[Key]) -> list[float]:
    return [end[k] - start[k] for k in keys if k in start and k in end]


def p50(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.5 * len(ordered) + 0.5) - 1))]


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)

    def pct(q: float) -> float:  # nearest rank
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]

    return f"{pct(0.5):.3f} / {pct(0.95):.3f} / {ordered[-1]:.3f}"


@dataclass
class Side:
    """One round of one side (operator or floor) for one N."""

    to_job: list[float]  # operator: DJ create -> Job (the floor: empty)
    to_pod: list[float]  # DJ create -> pod, or Job create -> pod
    done_to_end: list[float]  # last pod done -> DJ Succeeded, or pod done -> Job Complete
    all_done_s: float
    sent_over_s: float  # first create sent -> last create sent
    cpu_s: float = 0.0  # operator CPU during the round and the namespace's deletion


@dataclass
class Row:
    n: int
    operator: list[Side] = field(default_factory=list)
    floor: list[Side] = field(default_factory=list)
    peak_rss_mib: float = 0.0

    def pod_ratios(self) -> list[float]:
        return [p50(o.to_pod) / p50(f.to_pod) for o, f in zip(self.operator, self.floor, strict=True)]


def operator_round(api: Any, rec: Recorder, op: Operator, n: int, ns: str, timeout: float) -> Side:
    fresh_namespace(api, ns)
    cpu0 = op.cpu_seconds()
    custom = client.CustomObjectsApi(api)
    names = [f"dj-{i:03d}" for i in range(n)]
    sent = create_all(n, lambda i: custom.create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, dj_manifest(names[i], ns)))
    t0 = min(sent.values())
    keys = [(ns, name) for name in names]
    wait_until(lambda: all(k in rec.dj_succeeded for k in keys), timeout,
               f"{n} DiffusionJobs to succeed (operator log: {op.log.name})")
    total = max(rec.dj_succeeded[k] for k in keys) - t0
    start = {(ns, names[i]): t for i, t in sent.items()}
    seen, to_job = deltas(start, rec.dj_added, keys), deltas(rec.dj_added, rec.job_added, keys)
    print(f"  N={n} operator: creates sent over {max(sent.values()) - t0:.1f}s; DJ create -> seen by a watch "
          f"{summary(seen)}; DJ seen -> its Job {summary(to_job)}", flush=True)
    side = Side(deltas(start, rec.job_added, keys), deltas(start, rec.pod_added, keys),
                deltas(rec.pod_done, rec.dj_succeeded, keys), total, max(sent.values()) - t0)
    delete_namespace(api, ns)
    side.cpu_s = op.cpu_seconds() - cpu0
    return side


def floor_round(api: Any, rec: Recorder, n: int, ns: str, timeout: float,
                shape: str = "plain", over: float = 0.0) -> Side:
    fresh_namespace(api, ns)
    batch = client.BatchV1Api(api)
    names = [f"job-{i:03d}" for i in range(n)]
    body = plain_job if shape == "plain" else lambda name: rendered_job(name, ns)
    sent = create_all(n, lambda i: batch.create_namespaced_job(ns, body(names[i])), over)
    t0 = min(sent.values())
    keys = [(ns, name) for name in names]
    wait_until(lambda: all(k in rec.job_complete for k in keys), timeout, f"{n} Jobs to complete")
    total = max(rec.job_complete[k] for k in keys) - t0
    start = {(ns, names[i]): t for i, t in sent.items()}
    print(f"  N={n} floor: creates sent over {max(sent.values()) - t0:.1f}s; Job create -> seen by a watch "
          f"{summary(deltas(start, rec.job_added, keys))}", flush=True)
    side = Side([], deltas(start, rec.pod_added, keys), deltas(rec.pod_done, rec.job_complete, keys), total,
                max(sent.values()) - t0)
    delete_namespace(api, ns)
    return side


def apply_crd(api: Any) -> None:
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(CRD_FILE.read_text())
    ext.create_custom_resource_definition(body)

    def served() -> bool:
        got = ext.read_custom_resource_definition(body["metadata"]["name"])
        established = any(c.type == "Established" and c.status == "True"
                          for c in got.status.conditions or [])
        if not established:
            return False
        try:
            client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)
            return True
        except client.ApiException:
            return False

    wait_until(served, 60, "the DiffusionJob CRD to be served")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 50, 200])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per N, operator and floor alternating first")
    parser.add_argument("--quick", action="store_true", help="N = 3, 1 round: a check that it runs")
    parser.add_argument("--bin-dir", type=Path, default=None,
                        help="control plane binaries (default: hack/cluster-binaries.sh's cache)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    parser.add_argument("--floor-over", type=float, default=0.0,
                        help="spread the floor's creates over this many seconds (as slow DiffusionJob creates "
                        "spread the operator's Jobs), to tell the Job controller's queueing from the operator's cost")
    parser.add_argument("--floor", choices=["plain", "rendered"], default="plain",
                        help="the floor's Jobs: plain Indexed Jobs, or exactly the Job the operator renders")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rounds = [3], 1
    bin_dir = args.bin_dir or controlplane.default_bin_dir()
    if missing := controlplane.missing_binaries(bin_dir):
        raise SystemExit(f"missing in {bin_dir}: {', '.join(missing)}; run hack/cluster-binaries.sh")

    work = Path(tempfile.mkdtemp(prefix="muralist-opbench-"))
    cp = controlplane.ControlPlane(bin_dir, work / "cluster", nodes=NODES)
    op: Operator | None = None
    ws: list[Watcher] = []
    rows: list[Row] = []
    loads = [load_average()]
    began = time.monotonic()
    try:
        cp.start()
        print(f"control plane up in {cp.startup_seconds:.1f}s ({len(NODES)} kwok nodes); "
              f"load average {loads[0]}", flush=True)
        api = config.new_client_from_config(config_file=str(cp.kubeconfig))
        api.configuration.connection_pool_maxsize = CREATE_THREADS * 2
        apply_crd(api)
        rec = Recorder()
        ws = watchers(cp.kubeconfig, rec)
        for w in ws:
            w.start()
        for w in ws:
            w.ready.wait(30)
        op = Operator(cp.kubeconfig, work / "operator.log")
        if not args.quick:  # a warm-up job: the operator has listed and watched everything before we measure
            operator_round(api, rec, op, 1, "bench-warmup", 120)
        for n in args.sizes:
            timeout = 120 + 2 * n
            row = Row(n)
            for rnd in range(args.rounds):
                for side_name in ("operator", "floor") if rnd % 2 == 0 else ("floor", "operator"):
                    if side_name == "operator":
                        side = operator_round(api, rec, op, n, f"bench-op-{n}-r{rnd}", timeout)
                        row.operator.append(side)
                        print(f"  N={n} round {rnd + 1} operator: all Succeeded in {side.all_done_s:.1f}s, operator "
                              f"CPU during its round (and the namespace's deletion) {side.cpu_s:.1f}s", flush=True)
                    else:
                        side = floor_round(api, rec, n, f"bench-floor-{n}-r{rnd}", timeout, args.floor,
                                           args.floor_over)
                        row.floor.append(side)
                        print(f"  N={n} round {rnd + 1} floor: all Complete in {side.all_done_s:.1f}s", flush=True)
                print(f"N={n} round {rnd + 1}: create -> pod p50 operator / floor {row.pod_ratios()[-1]:.2f}; "
                      f"load {load_average()}", flush=True)
            row.peak_rss_mib = op.peak_rss_mib()
            rows.append(row)
            loads.append(load_average())
    finally:
        for w in ws:
            w.stopped.set()
        if op is not None:
            op.stop()
        cp.stop()
        if args.keep:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(rows, loads, time.monotonic() - began, args.rounds)
    return 0


def report(rows: list[Row], loads: list[str], seconds: float, rounds: int) -> None:
    med = statistics.median
    print(f"\nseconds, p50 / p95 / max over {rounds} round(s) (operator and floor alternating first); medians of "
          f"the rounds for the rest; load average at start and after each N: {' | '.join(loads)}; "
          f"total {seconds:.0f}s\n")
    print("| N | DJ create -> Job | DJ create -> pod | floor: Job create -> pod | ratio of p50s (per round) "
          "| last pod done -> DJ Succeeded | floor: pod done -> Job Complete | all N done (op / floor) "
          "| creates sent over (op / floor) | operator CPU | operator peak RSS |")
    print("|---:|---|---|---|---|---|---|---|---|---:|---:|")

    def pooled(sides: list[Side], attr: str) -> list[float]:
        return [v for side in sides for v in getattr(side, attr)]

    for r in rows:
        ratios = r.pod_ratios()
        print(f"| {r.n} | {summary(pooled(r.operator, 'to_job'))} | {summary(pooled(r.operator, 'to_pod'))} "
              f"| {summary(pooled(r.floor, 'to_pod'))} | {med(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)}) "
              f"| {summary(pooled(r.operator, 'done_to_end'))} | {summary(pooled(r.floor, 'done_to_end'))} "
              f"| {med(s.all_done_s for s in r.operator):.1f} s / {med(s.all_done_s for s in r.floor):.1f} s "
              f"| {med(s.sent_over_s for s in r.operator):.1f} s / {med(s.sent_over_s for s in r.floor):.1f} s "
              f"| {med(s.cpu_s for s in r.operator):.1f} s | {r.peak_rss_mib:.0f} MiB |")


if __name__ == "__main__":
    raise SystemExit(main())
