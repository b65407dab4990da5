"""`muralist operator`: wire settings, the reconciler, metrics and the clock, then run kopf."""

from __future__ import annotations

import argparse
import logging
import os
import random
import threading
from typing import Any

import kopf
from muralist_runtime.spec.contract import MURALIST_RUNTIME_IMAGE

from muralist_operator import handlers, metrics
from muralist_operator.kube import Kube, load_config
from muralist_operator.render import OperatorSettings


def settings_from(args: argparse.Namespace) -> OperatorSettings:
    image = args.runtime_image or os.environ.get(MURALIST_RUNTIME_IMAGE)
    return OperatorSettings(runtime_image=image) if image else OperatorSettings()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # We post our own Events (one per transition); kopf's would repeat handler log lines.
    settings.posting.enabled = False
    settings.execution.max_workers = 16
    # Reconnect watches promptly: a stale stream would delay every reaction.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30


def run_operator(args: argparse.Namespace) -> int:
    namespaces: list[str] = args.namespace
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    logging.getLogger("muralist").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    load_config()
    handlers.RECONCILER = handlers.Reconciler(Kube.connect(), settings_from(args))
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    stop = threading.Event()
    clock = threading.Thread(target=handlers.RECONCILER.run_clock, args=(stop,), name="muralist-clock", daemon=True)
    clock.start()
    try:
        kopf.run(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=args.peering is None,
            peering_name=args.peering,
            # kopf pauses every replica when two share a priority: make them differ.
            priority=args.priority if args.priority is not None else random.randint(1, 1_000_000),
            liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None,
        )
    finally:
        stop.set()
    return 0
