"""Progress pushed by the pods: an HTTPS endpoint (server), who may post (auth), its
certificate (tls), and job totals from the posts (aggregate). See server.py for the wire
contract and report.py for the body."""

from muralist_operator.progress.aggregate import Aggregator, IndexProgress, JobKey, JobProgress, post_interval
from muralist_operator.progress.auth import (
    AUDIENCE,
    Identity,
    PodInfo,
    TokenVerifier,
    Verdict,
    api_pod_lookup,
    pod_info,
)
from muralist_operator.progress.report import DEFAULT_POST_INTERVAL_SECONDS, PodReport, ReportError, parse_report
from muralist_operator.progress.server import PATH, ProgressServer, Verifier, client_context
from muralist_operator.progress.tls import TlsMaterial, ensure_certificate, read_mounted, service_names

__all__ = [
    "AUDIENCE",
    "DEFAULT_POST_INTERVAL_SECONDS",
    "PATH",
    "Aggregator",
    "Identity",
    "IndexProgress",
    "JobKey",
    "JobProgress",
    "PodInfo",
    "PodReport",
    "ProgressServer",
    "ReportError",
    "TlsMaterial",
    "TokenVerifier",
    "Verdict",
    "Verifier",
    "api_pod_lookup",
    "client_context",
    "ensure_certificate",
    "parse_report",
    "pod_info",
    "post_interval",
    "read_mounted",
    "service_names",
]
