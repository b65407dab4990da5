"""`muralist submit` and `muralist status`: a DiffusionJob on a cluster, through `muralist.Client`.

`submit --follow` exits with the job's outcome, so a pipeline step can run it as it is:
0 Succeeded, 1 Failed, 124 still running when --timeout passed (as timeout(1) does), 3 deleted
while followed, 2 when nothing could be submitted or followed (a manifest `muralist validate`
refuses, an API error, no such job).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_NOT_SUBMITTED = 2
EXIT_DELETED = 3
EXIT_TIMEOUT = 124


def exit_code(outcome: Any) -> int:
    """The exit code for how following a job ended: its final status, or the error it raised."""
    from muralist import JobDeleted, JobFailed, WaitTimeout
    from muralist_api.status import DiffusionJobStatus, Phase

    if isinstance(outcome, DiffusionJobStatus):
        return EXIT_SUCCEEDED if outcome.phase == Phase.SUCCEEDED else EXIT_FAILED
    if isinstance(outcome, JobFailed):
        return EXIT_FAILED
    if isinstance(outcome, WaitTimeout):
        return EXIT_TIMEOUT
    if isinstance(outcome, JobDeleted):
        return EXIT_DELETED
    return EXIT_NOT_SUBMITTED


def api_error_text(error: Any) -> str:
    """An ApiException as the API server's one-line message (its Status body), not the whole response."""
    try:
        message = json.loads(error.body or "").get("message")
    except (ValueError, AttributeError):
        message = None
    return f"{error.status} {error.reason}: {message}" if message else f"{error.status} {error.reason}"


def _client(args: argparse.Namespace) -> Any:
    from muralist import Client

    return Client(namespace=args.namespace, kubeconfig=args.kubeconfig, context=args.context)


def _connection_failed(error: Exception) -> int:
    sys.stderr.write(f"cannot reach the cluster: {error}\n")
    return EXIT_NOT_SUBMITTED


def submit(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from muralist import JobDeleted, JobFailed, WaitTimeout
    from muralist_api.manifests import ManifestError
    from muralist_api.rules.problems import ValidationProblem

    try:
        client = _client(args)
    except (ConfigException, ValueError) as e:
        return _connection_failed(e)
    try:
        job = client.create(sys.stdin.read() if args.manifest == "-" else Path(args.manifest))
    except ValidationProblem as e:
        sys.stderr.write("".join(f"{p}\n" for p in e.problems))
        return EXIT_NOT_SUBMITTED
    except (ManifestError, ValueError) as e:
        sys.stderr.write(f"{e}\n")
        return EXIT_NOT_SUBMITTED
    except ApiException as e:
        sys.stderr.write(f"{args.manifest}: not created: {api_error_text(e)}\n")
        return EXIT_NOT_SUBMITTED
    name = job.metadata.name
    sys.stdout.write(f"diffusionjob.muralist.dev/{name} created in {job.metadata.namespace}\n")
    if not args.follow:
        return EXIT_SUCCEEDED
    client.namespace = job.metadata.namespace or client.namespace
    try:
        status = client.wait(name, progress=not args.quiet, timeout=args.timeout)
    except (JobFailed, WaitTimeout, JobDeleted) as e:
        sys.stderr.write(f"{e}\n")
        return exit_code(e)
    except ApiException as e:
        sys.stderr.write(f"{name}: {api_error_text(e)}\n")
        return exit_code(e)
    sys.stdout.write(f"{name}: {status.phase}, {status.progress.completed} images in {status.output_path}\n")
    return exit_code(status)


def status(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from muralist import describe

    try:
        client = _client(args)
    except (ConfigException, ValueError) as e:
        return _connection_failed(e)
    try:
        sys.stdout.write(describe(args.name, client.status(args.name)) + "\n")
    except ApiException as e:
        sys.stderr.write(f"{args.name} (namespace {client.namespace}): {api_error_text(e)}\n")
        return EXIT_NOT_SUBMITTED
    return 0


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", "-n", default=None,
                        help="Namespace (default: the manifest's, else the kubeconfig context's, else 'default').")
    parser.add_argument("--kubeconfig", default=None,
                        help="Kubeconfig file (default: $KUBECONFIG or ~/.kube/config; in a pod without one, "
                        "its service account).")
    parser.add_argument("--context", default=None, help="Kubeconfig context (default: the current one).")
