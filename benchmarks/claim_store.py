#!/usr/bin/env python3
"""Cost of one claim and claims/s of one claim server (`muralist_runtime.work.claims`), on loopback.

    ~/.cache/muralist/venv/bin/python benchmarks/claim_store.py [--claims 5000] [--clients 1 2 4]

- per-claim latency: one client, sequential claims, three ways: `TCPStore.add` directly,
  `ClaimClient` without its worker thread (`op_timeout_s=None`), and `ClaimClient` as shipped
  (each claim handed to a worker thread so a partitioned connection can be abandoned);
- throughput: N client processes claim `--claims` chunks each, started together (they block on
  a "go" key of the same store), against a server in its own process: libuv (the default),
  libuv while the hosting process's main thread spins in Python holding the GIL (as a busy
  rank 0 would), and the legacy non-libuv server.

Loopback only: a claim across pods adds one network round trip (~50-200 µs in a cluster).
On a 2-core machine the clients compete with the server for CPU, so throughput is a floor.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

SERVER = """
import sys, time
from muralist_runtime.work.claims import ClaimServer
server = ClaimServer(0, use_libuv={libuv})
print(server.port, flush=True)
if {spin}:
    while True:  # a busy rank 0: pure Python, holding the GIL between bytecodes
        sum(range(1000))
sys.stdin.read()
"""

CLIENT = """
import datetime, json, sys, time
import torch.distributed as dist
from muralist_runtime.work.claims import ClaimClient
port, n, run = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
client = ClaimClient("127.0.0.1", port, "bench")
gate = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60))
gate.add(f"{run}/ready", 1)
gate.get(f"{run}/go")
t = time.perf_counter()
for _ in range(n):
    client.next_chunk()
print(json.dumps({"seconds": time.perf_counter() - t}))
"""


def start_server(libuv: bool, spin: bool) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER.format(libuv=libuv, spin=spin)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"})
    return proc, int(proc.stdout.readline())


def latency_us(port: int, n: int) -> dict[str, float]:
    import torch.distributed as dist
    from muralist_runtime.work.claims import ClaimClient

    store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=30))
    direct = ClaimClient("127.0.0.1", port, "lat-direct", op_timeout_s=None)
    shipped = ClaimClient("127.0.0.1", port, "lat")
    out = {}
    ways = (("TCPStore.add", lambda: store.add("lat-raw/next", 1)), ("ClaimClient, no worker", direct.next_chunk),
            ("ClaimClient (worker thread)", shipped.next_chunk))
    for name, fn in ways:
        fn()  # connect
        rounds = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n // 5):
                fn()
            rounds.append((time.perf_counter() - t) / (n // 5) * 1e6)
        out[name] = statistics.median(rounds)
    direct.close()
    shipped.close()
    return out


def throughput(port: int, clients: int, n: int) -> float:
    import torch.distributed as dist

    gate = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60))
    run = f"run-{clients}"
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, str(port), str(n), run], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}) for _ in range(clients)]
    while gate.add(f"{run}/ready", 0) < clients:  # imports take seconds: poll, then release them together
        time.sleep(0.05)
    gate.set(f"{run}/go", "1")
    seconds = [json.loads(p.communicate(timeout=300)[0])["seconds"] for p in procs]
    return clients * n / max(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=5000, help="claims per client")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    import torch

    lines = [f"torch {torch.__version__}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", "",
             "| one claim, sequential, loopback | µs |", "|---|---|"]
    proc, port = start_server(libuv=True, spin=False)
    try:
        for name, us in latency_us(port, args.claims).items():
            lines.append(f"| {name} | {us:.1f} |")
    finally:
        proc.kill()
        proc.wait()
    lines += ["", "| server | " + " | ".join(f"{c} client{'s' * (c > 1)} claims/s" for c in args.clients) + " |",
              "|---|" + "---|" * len(args.clients)]
    for label, libuv, spin in (("libuv", True, False), ("libuv, host main thread busy in Python", True, True),
                               ("legacy (use_libuv=False)", False, False)):
        proc, port = start_server(libuv, spin)
        try:
            rates = [throughput(port, c, args.claims) for c in args.clients]
        finally:
            proc.kill()
            proc.wait()
        lines.append(f"| {label} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
