"""A pod's progress posts, made by a test as the runtime's poster makes them (runtime/muralist_runtime/
report/push.py): the URL, CA and token the pod is given, the wire body. The cluster tier's pods are
kwok's and run nothing; tests/cluster/test_pod_e2e.py runs the real runtime.

A NetworkPolicy is not enforced on the test control plane (no network plugin): a post whose pod's
egress the namespace's policies deny is refused here, before it is sent, as the plugin would drop
its packets (tests/network_policies.py reads the policies with the API server's own selectors)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

from muralist_api import contract

from tests.network_policies import egress_denied
from tests.operator_helpers import DJ, pod_index


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Blocked(ConnectionError):
    """A NetworkPolicy denies the pod's egress: the post never leaves it."""


class Poster:
    """One pod's poster: its URL, CA and a token bound to it, as the kubelet would mount them."""

    def __init__(self, dj: DJ, pod: Any, audience: str = contract.PROGRESS_AUDIENCE, as_pod: Any = None):
        env = {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}
        self.url = env[contract.MURALIST_PROGRESS_URL]
        job = pod.metadata.labels["muralist.dev/job-name"]
        ca = dj.core.read_namespaced_config_map(f"{job}-spec", dj.ns).data[contract.PROGRESS_CA_KEY]
        self.ctx = ssl.create_default_context(cadata=ca)
        self.dj = dj
        bound = as_pod or pod
        self.token = self.token_for(audience, bound)
        self.pod, self.index = bound.metadata.name, pod_index(bound)

    def token_for(self, audience: str, pod: Any) -> str:
        spec = {"audiences": [audience], "expirationSeconds": contract.PROGRESS_TOKEN_SECONDS,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
                                   "uid": pod.metadata.uid}}
        return str(self.dj.core.create_namespaced_service_account_token("default", self.dj.ns,
                                                                        {"spec": spec}).status.token)

    def post(self, completed: int, total: int, step: datetime | None = None, done: bool = False,
             token: str | None = "mine", loading: bool = False) -> tuple[int, Any]:
        """(status, body) of the endpoint's answer; Blocked when a NetworkPolicy denies the pod's egress."""
        if egress_denied(self.dj.core, self.dj.ns, self.pod):
            raise Blocked(f"a NetworkPolicy of {self.dj.ns} denies the egress of pod {self.pod}")
        now = datetime.now(UTC)
        body = {"pod": self.pod, "index": self.index, "attempt": 0, "ranks": 1, "completed": completed,
                "skipped": 0, "failed": 0, "total": total,
                "lastStepTime": None if loading else stamp(step or now),
                "lastImageTime": None if loading else stamp(step or now), "sentAt": stamp(now), "final": False,
                "done": done}
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {self.token if token == 'mine' else token}"
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as resp:
                text = resp.read()
                return resp.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")
