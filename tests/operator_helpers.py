"""The operator under test: the CRD, `muralist operator` as a subprocess, and a small client
for DiffusionJobs. Shared by the `cluster` (kwok) and `e2e` (real node) tests."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from muralist_api.job import GROUP, PLURAL, VERSION

from tests.kube_helpers import wait_for

REPO = Path(__file__).resolve().parents[1]
CRD_FILE = REPO / "crds" / "muralist.dev_diffusionjobs.yaml"


def apply_crd(api: Any, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """The DiffusionJob CRD from crds/ (or `body`: another version's), applied (or put in place of the
    one there) and served."""
    ext = client.ApiextensionsV1Api(api)
    body = copy.deepcopy(body) if body is not None else yaml.safe_load(CRD_FILE.read_text())
    # A body read back from the server (another version's, kept by a test) carries its resourceVersion, which a
    # create refuses (500 "resourceVersion should not be set on objects to be created", CI 2026-12-05).
    body["metadata"].pop("resourceVersion", None)
    try:
        ext.create_custom_resource_definition(body)
    except client.ApiException as e:
        if e.status != 409:  # another fixture of the session (the chart tests) applied it
            raise
        current = ext.read_custom_resource_definition(body["metadata"]["name"])
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(body["metadata"]["name"], body)

    def established() -> bool:
        got = ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in got.status.conditions or [])

    wait_for(established, timeout=30, message="the DiffusionJob CRD to be established")
    # Discovery can lag behind Established: wait until the resource can be listed.
    wait_for(
        lambda: client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL) is not None,
        timeout=30,
        message="DiffusionJobs to be served",
    )
    return body


def free_port() -> int:
    """A port to listen on, free now and below the ephemeral range (muralist_runtime.local)."""
    from muralist_runtime.local import free_port_range

    return free_port_range(1)


class OperatorProcess:
    """`muralist operator` against a test control plane; can be killed and restarted.

    Its progress endpoint listens on a free port of this machine, for pods that post from here
    (tests/cluster/test_pod_e2e.py): `progress_host` must be a name (or address) that reaches
    this machine from where the pods run; the self-managed certificate names it."""

    def __init__(
        self,
        kubeconfig: Path,
        log_dir: Path,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        runtime_image: str = "muralist-runtime:test",
        progress_host: str = "localhost",
        operator_namespace: str = "default",
    ):
        self.kubeconfig, self.log_dir, self.runtime_image = kubeconfig, log_dir, runtime_image
        self.progress_port = free_port()
        self.progress_url = f"https://{progress_host}:{self.progress_port}"
        self.operator_namespace = operator_namespace
        self.extra_args = [
            "--operator-namespace", operator_namespace,
            "--progress-port", str(self.progress_port),
            "--progress-url", self.progress_url,
            "--progress-tls-name", progress_host,
            *(extra_args or []),
        ]
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"operator-{self.starts}.log", "wb")  # noqa: SIM115 (owned by the process)
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "muralist_cli",
                "operator",
                "--health-port",
                "0",
                "--metrics-port",
                "0",
                "--runtime-image",
                self.runtime_image,
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log")))


def pod_index(pod: Any) -> int:
    return int(pod.metadata.annotations["batch.kubernetes.io/job-completion-index"])


class DJ:
    """Small client for DiffusionJobs and their children in one namespace."""

    def __init__(self, api: Any, namespace: str):
        self.ns = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, manifest)

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec})

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        return wait_for(
            lambda: (s := self.status(name)).get("phase") == phase and s,
            timeout=timeout,
            message=f"{name} to reach {phase} (now {self.status(name).get('phase')})",
        )

    def pods(self, name: str, index: int | None = None) -> list[Any]:
        """The job's pods not being deleted (of one completion index, if given), oldest first."""
        pods = self.core.list_namespaced_pod(self.ns, label_selector=f"muralist.dev/job-name={name}").items
        pods = [p for p in pods if p.metadata.deletion_timestamp is None
                and (index is None or pod_index(p) == index)]
        return sorted(pods, key=lambda p: (pod_index(p), p.metadata.creation_timestamp))

    def wait_pods(self, name: str, count: int, phase: str = "Running") -> list[Any]:
        """`count` pods of the job in `phase`, by completion index."""
        return wait_for(
            lambda: len(ps := [p for p in self.pods(name) if p.status.phase == phase]) == count and ps,
            timeout=60,
            message=f"{count} {phase} pods of {name}",
        )

    def events(self, name: str) -> list[str]:
        items = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        return [e.reason for e in items if e.involved_object.kind == "DiffusionJob"]

    def wait_events(self, name: str, *reasons: str, timeout: float = 30) -> list[str]:
        """The job's event reasons once all of `reasons` are among them: kopf posts events
        asynchronously, after the status patch a test may have waited for."""
        return wait_for(
            lambda: set(reasons) <= set(got := self.events(name)) and got,
            timeout=timeout,
            message=f"events {sorted(reasons)} on {name} (now {self.events(name)})",
        )
