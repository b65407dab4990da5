"""kopf's side of the operator: the indexes it keeps of our children and the triggers that run
the Reconciler (reconciler.py) for a job.

Children are watched by label (the API server sends only objects labelled as a job's) and indexed
by their controller (the owner reference with `controller: true`): a Job by its DiffusionJob, a
pod by its Job (named as its DiffusionJob). An object that is labelled as a job's and not owned by
it is not indexed at all; the reconciler also checks the owner's uid (observe), since a name is
no proof.

No handler here needs a finalizer: deleting a DiffusionJob never waits for the operator, and
the garbage collector removes its children through their owner references.
"""

from __future__ import annotations

from typing import Any

import kopf
from muralist_api.job import GROUP, KIND, PLURAL, VERSION

from muralist_operator.naming import LABEL_COMPONENT, LABEL_JOB
from muralist_operator.observe import child_view, controller_name, job_view, owner_of, pod_view
from muralist_operator.progress.auth import PodInfo, pod_info
from muralist_operator.reconciler import Key, Reconciler, RenderFailure

__all__ = ["RECONCILER", "Reconciler", "RenderFailure", "reconciler"]

RECONCILER: Reconciler | None = None


def reconciler() -> Reconciler:
    if RECONCILER is None:
        raise RuntimeError("the operator has not started")
    return RECONCILER


# -- indexes: what the operator knows about children, kept current by kopf's watches
# (kopf's handler protocols type `namespace` as optional, for cluster-scoped objects; every
# object watched here is namespaced, hence the ignores on the decorators)


@kopf.index(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
def muralist_diffusionjobs(namespace: str, name: str, **_: Any) -> dict[Key, bool]:
    return {(namespace, name): True}


def _by_controller(namespace: str, body: kopf.Body, kind: str, view: Any) -> dict[Key, Any]:
    owner = controller_name(body, kind)
    return {(namespace, owner): view(body)} if owner else {}


@kopf.index("batch", "v1", "jobs", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def muralist_jobs(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return _by_controller(namespace, body, KIND, job_view)


@kopf.index("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT, LABEL_COMPONENT: "worker"})  # type: ignore[arg-type]
def muralist_pods(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return _by_controller(namespace, body, "Job", pod_view)


# What a job owns besides its Job: each is created again when it is gone.
@kopf.index("", "v1", "services", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def muralist_services(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return _by_controller(namespace, body, KIND, child_view)


@kopf.index("", "v1", "configmaps", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def muralist_config_maps(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return _by_controller(namespace, body, KIND, child_view)


@kopf.index("networking.k8s.io", "v1", "networkpolicies", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def muralist_network_policies(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return _by_controller(namespace, body, KIND, child_view)


@kopf.index("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT, LABEL_COMPONENT: "worker"})  # type: ignore[arg-type]
def muralist_pod_info(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Key, PodInfo]:
    """By pod name: who may post progress (progress/auth.py checks a token's pod against it)."""
    return {(namespace, name): pod_info(body)}


# -- triggers


@kopf.on.event(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
def diffusion_job_event(namespace: str, name: str, type: str | None, body: kopf.Body, **kwargs: Any) -> None:
    r = reconciler()
    r.remember_indexes(kwargs)
    if type == "DELETED":
        r.forget((namespace, name))
        return
    # The raw body as kopf received it, not copied: nothing in a reconcile changes it.
    if r.seen((namespace, name), dict(body)):
        r.reconcile(namespace, name)


def _child_event(namespace: str, body: kopf.Body, kwargs: dict[str, Any]) -> None:
    owner = owner_of(body)  # the label: an object that only claims to be a job's costs a reconcile, no more
    if owner:
        r = reconciler()
        r.remember_indexes(kwargs)
        r.reconcile(namespace, owner)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def job_event(namespace: str, body: kopf.Body, **kwargs: Any) -> None:
    _child_event(namespace, body, kwargs)


@kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT, LABEL_COMPONENT: "worker"})  # type: ignore[arg-type]
def pod_event(namespace: str, body: kopf.Body, **kwargs: Any) -> None:
    _child_event(namespace, body, kwargs)


@kopf.on.event("", "v1", "services", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def service_event(namespace: str, body: kopf.Body, **kwargs: Any) -> None:
    _child_event(namespace, body, kwargs)


@kopf.on.event("", "v1", "configmaps", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def config_map_event(namespace: str, body: kopf.Body, **kwargs: Any) -> None:
    _child_event(namespace, body, kwargs)


@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def network_policy_event(namespace: str, body: kopf.Body, **kwargs: Any) -> None:
    _child_event(namespace, body, kwargs)
