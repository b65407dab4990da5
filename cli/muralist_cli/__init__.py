"""`muralist`: one command line for the API, the operator and the local runtime.

Each subcommand imports its implementation lazily, so `muralist validate` works in the
operator image (no torch) and `muralist run` works without kopf. `submit` and `status` live in
`jobs` (their exit codes; the Python client `muralist` does the work); `plan` (what strategy Auto
would choose, with its reasons) in `plan`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def _validate(args: argparse.Namespace) -> int:
    from muralist_operator.manifests import validate_files

    return validate_files(args.files)


def _crd(args: argparse.Namespace) -> int:
    import yaml
    from muralist_operator.crd import build_crd

    sys.stdout.write(yaml.safe_dump(build_crd(), sort_keys=False, width=100))
    return 0


def _render(args: argparse.Namespace) -> int:
    from muralist_operator.manifests import render_files

    return render_files(args.files, namespace=args.namespace, image=args.image)


def _operator(args: argparse.Namespace) -> int:
    from muralist_operator.main import run_operator

    return run_operator(args)


def _run(args: argparse.Namespace) -> int:
    from muralist_runtime.local import run_local

    return run_local(args)


def _tiny_pipeline(args: argparse.Namespace) -> int:
    from muralist_runtime.model.tiny import build_tiny_pipeline

    path = build_tiny_pipeline(args.directory)
    print(path)
    return 0


def _submit(args: argparse.Namespace) -> int:
    from muralist_cli.jobs import submit

    return submit(args)


def _status(args: argparse.Namespace) -> int:
    from muralist_cli.jobs import status

    return status(args)


def _plan(args: argparse.Namespace) -> int:
    from muralist_cli.plan import plan

    return plan(args)


def _device_arguments(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--gpu-memory", default=None, metavar="SIZE",
                   help=f"Memory of one device {what} (80GiB, 24G); without GPUs, a budget per process. Default: "
                   "nvidia-smi's, or the memory available now shared by the processes.")
    p.add_argument("--interconnect", choices=["nvlink", "pcie"], default=None,
                   help="How the GPUs of a pod are linked (tensor parallelism needs NVLink); default pcie.")


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid int value" message
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="muralist",
        description="Parallel diffusion image generation on Kubernetes (and on one machine).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(handler=handler)
        return p

    p = command("validate", _validate, "Validate DiffusionJob manifests (multi-document YAML; '-' reads stdin).")
    p.add_argument("files", nargs="+", metavar="FILE")

    command("crd", _crd, "Print the DiffusionJob CustomResourceDefinition generated from the API models.")

    p = command("render", _render, "Print the objects the operator creates for a DiffusionJob, as YAML.")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--namespace", "-n", default=None, help="Namespace (default: the manifest's, or 'default').")
    p.add_argument("--image", default=None, help="Default runtime image (operator setting).")

    p = command("operator", _operator, "Run the operator (kopf) against the current kubeconfig or in-cluster config.")
    p.add_argument(
        "--namespace", "-n", action="append", default=[], help="Watch this namespace (repeatable); default all."
    )
    p.add_argument("--runtime-image", default=None, help="Default runtime image (or MURALIST_RUNTIME_IMAGE).")
    p.add_argument("--network-policies", action=argparse.BooleanOptionalAction, default=True,
                   help="Give each DiffusionJob a NetworkPolicy that admits only its own pods to them (a job's "
                   "spec.networkPolicy.enabled overrides it).")
    p.add_argument("--price-per-gpu-hour", type=float, default=None, metavar="PRICE",
                   help="What a GPU-hour costs, for each job's status.cost (a job's muralist.dev/price-per-gpu-hour "
                   "annotation overrides it); unset: GPU-seconds only.")
    p.add_argument("--health-port", type=int, default=8080, help="Liveness/readiness endpoint port (0: off).")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0: off).")
    p.add_argument("--peering", default=None, help="kopf peering name, for several replicas (leader election).")
    p.add_argument(
        "--priority",
        type=int,
        default=None,
        help="Peering priority: the highest runs, the others stand by (default: random, so replicas differ).",
    )
    p.add_argument("--operator-namespace", default=None,
                   help="Where the operator's own objects live (the progress certificate's Secret); default the "
                   "pod's namespace (POD_NAMESPACE or the service account's), else 'default'.")
    g = p.add_argument_group("progress endpoint (pods post their counts here over HTTPS)")
    g.add_argument("--progress-port", type=int, default=8443, help="Port (0: no endpoint; status counts then come "
                   "from the pods' termination messages only).")
    g.add_argument("--progress-url", default=None,
                   help="Base URL the pods post to; default https://SERVICE.NAMESPACE.svc:PORT.")
    g.add_argument("--progress-service", default="muralist-progress",
                   help="The progress Service's name: the certificate names it.")
    g.add_argument("--progress-tls-secret", default="muralist-progress-tls",
                   help="Secret of the self-managed CA and certificate (created and renewed by the operator).")
    g.add_argument("--progress-tls-name", action="append", default=[],
                   help="Another DNS name or IP address for the self-managed certificate (repeatable).")
    g.add_argument("--progress-tls-dir", default=None,
                   help="Read tls.crt, tls.key and ca.crt from this directory instead (cert-manager's Secret, "
                   "mounted); re-read every minute.")
    # What all clients together may hold of the endpoint (any pod of the cluster can connect);
    # unset: the endpoint's defaults (muralist_operator.progress.connections.Limits).
    g.add_argument("--progress-max-connections", type=_positive(int), default=None, metavar="N",
                   help="Open connections at most (default 4096); at the cap, the oldest that has not authenticated "
                   "makes room.")
    g.add_argument("--progress-handshake-timeout", type=_positive(float), default=None, metavar="SECONDS",
                   help="From a connection's accept to the end of its TLS handshake (default 30).")
    g.add_argument("--progress-request-timeout", type=_positive(float), default=None, metavar="SECONDS",
                   help="From a request's first byte to its last; also how long a connection that has not "
                   "authenticated may stay idle (default 30).")
    g.add_argument("--progress-idle-timeout", type=_positive(float), default=None, metavar="SECONDS",
                   help="How long a pod's connection may stay idle between posts (default 120).")
    g.add_argument("--progress-active-label", action="store_true",
                   help="Label this replica's pod (POD_ID) muralist.dev/progress-active=true while it reconciles, "
                   "for a progress Service in front of several replicas.")
    p.add_argument("--log-format", choices=["plain", "json"], default="plain")
    p.add_argument("--verbose", "-v", action="store_true")

    p = command("run", _run, "Run a DiffusionJob manifest on this machine, without a cluster.")
    p.add_argument("manifest", metavar="JOB.yaml")
    p.add_argument("--output", "-o", default=None,
                   help="Output directory, or an object storage URI (s3://bucket/prefix); default "
                   "spec.output.uri/<output.path>, else ./muralist-output/<output.path>.")
    p.add_argument("--model", default=None, help="Load the model from this local directory instead of spec.model.name.")
    p.add_argument("--prompts-file", default=None, help="A file with one prompt per line, standing in for promptsFrom.")
    p.add_argument("--dataset-dir", default=None,
                   help="The folder standing in for spec.dataset.volume (default: its hostPath).")
    p.add_argument("--inputs-dir", default=None,
                   help="The folder standing in for spec.inputs.volume (default: its hostPath).")
    _device_arguments(p, "strategy Auto plans for")

    p = command("plan", _plan, "Choose spec.parallelism for a DiffusionJob the way strategy Auto does: print it "
                "as YAML, one reason per decision with its figures, and the estimated peak memory per GPU.")
    p.add_argument("manifest", metavar="JOB.yaml")
    p.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                   help="GPUs per pod (default the manifest's gpusPerNode; 0 plans for CPU processes).")
    _device_arguments(p, "to plan for")
    p.add_argument("--model", default=None, help="Read the model's sizes from this local directory instead of "
                   "spec.model.name.")
    p.add_argument("--objective", choices=["throughput", "latency"], default=None,
                   help="Plan for this objective (default the manifest's, else throughput).")

    from muralist_cli.jobs import add_connection_arguments

    p = command("submit", _submit, "Create a DiffusionJob on the cluster (checked as `validate` checks it first); "
                "with --follow, show its progress and exit with its outcome: 0 Succeeded, 1 Failed, 124 timed out.")
    p.add_argument("manifest", metavar="JOB.yaml",
                   help="One DiffusionJob (and the ConfigMaps it reads, if any); '-' reads stdin.")
    p.add_argument("--follow", "-f", action="store_true", help="Follow the job to its end with a progress bar.")
    p.add_argument("--timeout", type=_positive(float), default=None, metavar="SECONDS",
                   help="With --follow: stop following after this long (exit 124; the job keeps running).")
    p.add_argument("--quiet", "-q", action="store_true", help="With --follow: no progress bar.")
    add_connection_arguments(p)

    p = command("status", _status, "Show a DiffusionJob's phase, progress, rate and ETA, failed items and indexes.")
    p.add_argument("name", metavar="NAME")
    add_connection_arguments(p)

    p = command("tiny-pipeline", _tiny_pipeline, "Build a tiny random-weight Flux pipeline offline into DIRECTORY.")
    p.add_argument("directory", metavar="DIR")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
