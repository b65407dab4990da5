"""Progress pushed by the pods: an HTTPS endpoint and job totals from the posts.

- `server`: the endpoint's routes and checks, on its own thread and event loop;
- `http1`: HTTP/1.1 framing (httptools); `connections`: the connection cap, clocks and memory
  give-back; `coalesce`: the event loop that serves a burst of posts with one wake-up;
- `tls_accept`: TLS started once a client speaks (ssl.SSLObject over memory BIOs); `tls`: its
  certificate, self-managed in a Secret or mounted;
- `auth`: who may post (TokenReview, the pod's index and owner);
- `aggregate`: job totals, rate, ETA and the status-write throttle from the posts; `snapshot`:
  what they say of a job at one moment (`JobProgress`).

The body a pod posts, its path, audience and interval are the progress wire of the API
(muralist_api.contract.progress). The endpoint knows nothing of the reconciler: it is handed
callbacks (import-linter checks its layers)."""

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
