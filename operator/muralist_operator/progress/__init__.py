"""Progress pushed by the pods: an HTTPS endpoint (server), who may post (auth), its
certificate (tls), and job totals from the posts (aggregate). The body a pod posts, its path,
audience and interval are the progress wire of the API (muralist_api.contract.progress)."""

from muralist_operator.progress.aggregate import Aggregator, JobKey, post_interval
from muralist_operator.progress.auth import (
    AuthVerdict,
    Identity,
    JobLookup,
    PodInfo,
    TokenVerifier,
    api_job_lookup,
    api_pod_lookup,
    pod_info,
)
from muralist_operator.progress.server import ProgressServer, Verifier, client_context
from muralist_operator.progress.snapshot import IndexProgress, JobProgress, PostError
from muralist_operator.progress.tls import TlsMaterial, ensure_certificate, read_mounted, service_names

__all__ = [
    "Aggregator",
    "AuthVerdict",
    "Identity",
    "IndexProgress",
    "JobKey",
    "JobLookup",
    "JobProgress",
    "PodInfo",
    "PostError",
    "ProgressServer",
    "TlsMaterial",
    "TokenVerifier",
    "Verifier",
    "api_job_lookup",
    "api_pod_lookup",
    "client_context",
    "ensure_certificate",
    "pod_info",
    "post_interval",
    "read_mounted",
    "service_names",
]
