"""The progress wire: what a pod tells the operator (and its log) about its progress."""

from __future__ import annotations

# One line per finished image on a pod's stdout, for log-based tooling.
PROGRESS_LINE_PREFIX = "MURALIST_PROGRESS "

# -- pushed progress (the operator's HTTPS endpoint) -------------------------------------------
PROGRESS_AUDIENCE = "muralist.dev"  # of the pods' projected service-account token
PROGRESS_TOKEN_DIR = "/var/run/secrets/muralist.dev/progress"
PROGRESS_TOKEN_FILE = f"{PROGRESS_TOKEN_DIR}/token"
PROGRESS_TOKEN_SECONDS = 600  # the shortest expiry the API server accepts; the kubelet rotates it
PROGRESS_CA_KEY = "progress-ca.crt"  # a key of the spec ConfigMap, mounted beside the spec
PROGRESS_PATH = "/v1/namespaces/{namespace}/diffusionjobs/{job}/progress"


def progress_url(base: str, namespace: str, job: str) -> str:
    """Where the pods of one job post: the operator's progress Service (`https://svc.ns.svc:port`)."""
    return base.rstrip("/") + PROGRESS_PATH.format(namespace=namespace, job=job)

