"""kopf's side of the operator: the indexes it keeps of our children and the triggers that run
the Reconciler (reconciler.py) for a job.

The Reconciler is the operator's state: main.py makes it and hands it to `kopf.run` in kopf's
`memo`, and every handler here takes it from there (`reconciler_of`). Each index is registered
under its name in indexes.Index (the handler's id), which is the name kopf hands it to every
handler by, and the name the reconciler reads it by.

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

from muralist_operator.indexes import Index, Key
from muralist_operator.naming import LABEL_COMPONENT, LABEL_JOB
from muralist_operator.observe import child_view, controller_name, job_view, owner_of, pod_view
from muralist_operator.progress.auth import PodInfo, pod_info
from muralist_operator.reconciler import Reconciler

MEMO_RECONCILER = "reconciler"


def reconciler_of(memo: kopf.Memo) -> Reconciler:
    """The Reconciler main.py put in kopf's memo."""
    reconciler = memo.get(MEMO_RECONCILER)
    if not isinstance(reconciler, Reconciler):
        raise RuntimeError("the operator has not started: kopf's memo holds no Reconciler")
    return reconciler


# -- indexes: what the operator knows about children, kept current by kopf's watches
# (kopf's handler protocols type `namespace` as optional, for cluster-scoped objects; every
# object watched here is namespaced, hence the ignores on the decorators)


@kopf.index(GROUP, VERSION, PLURAL, id=Index.DIFFUSION_JOBS)  # type: ignore[arg-type]
def muralist_diffusionjobs(namespace: str, name: str, **_: Any) -> dict[Key, bool]:
    return {(namespace, name): True}


def _by_controller(namespace: str, body: kopf.Body, kind: str, view: Any) -> dict[Key, Any]:
    owner = controller_name(body, kind)
    return {(namespace, owner): view(body)} if owner else {}


@kopf.index("batch", "v1", "jobs", labels={LABEL_JOB: kopf.PRESENT}, id=Index.JOBS)  # type: ignore[arg-type]
def muralist_jobs(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return _by_controller(namespace, body, KIND, job_view)


@kopf.index("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT, LABEL_COMPONENT: "worker"},  # type: ignore[arg-type]
            id=Index.PODS)
def muralist_pods(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return _by_controller(namespace, body, "Job", pod_view)


# What a job owns besides its Job: each is created again when it is gone.
@kopf.index("", "v1", "services", labels={LABEL_JOB: kopf.PRESENT}, id=Index.SERVICES)  # type: ignore[arg-type]
def muralist_services(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return _by_controller(namespace, body, KIND, child_view)


@kopf.index("", "v1", "configmaps", labels={LABEL_JOB: kopf.PRESENT}, id=Index.CONFIG_MAPS)  # type: ignore[arg-type]
def muralist_config_maps(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return _by_controller(namespace, body, KIND, child_view)


@kopf.index("networking.k8s.io", "v1", "networkpolicies", labels={LABEL_JOB: kopf.PRESENT},  # type: ignore[arg-type]
            id=Index.NETWORK_POLICIES)
def muralist_network_policies(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return _by_controller(namespace, body, KIND, child_view)


@kopf.index("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT, LABEL_COMPONENT: "worker"},  # type: ignore[arg-type]
            id=Index.POD_INFO)
def muralist_pod_info(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Key, PodInfo]:
    """By pod name: who may post progress (progress/auth.py checks a token's pod against it)."""
    return {(namespace, name): pod_info(body)}


# -- triggers


@kopf.on.event(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
def diffusion_job_event(namespace: str, name: str, type: str | None, body: kopf.Body, memo: kopf.Memo,
                        **kwargs: Any) -> None:
    r = reconciler_of(memo)
    r.indexes.remember(kwargs)
    if type == "DELETED":
        r.forget((namespace, name))
        return
    # The raw body as kopf received it, not copied: nothing in a reconcile changes it.
    if r.seen((namespace, name), dict(body)):
        r.reconcile(namespace, name)


def _child_event(namespace: str, body: kopf.Body, memo: kopf.Memo, kwargs: dict[str, Any]) -> None:
    owner = owner_of(body)  # the label: an object that only claims to be a job's costs a reconcile, no more
    if owner:
        r = reconciler_of(memo)
        r.indexes.remember(kwargs)
        r.reconcile(namespace, owner)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def job_event(namespace: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    _child_event(namespace, body, memo, kwargs)


@kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT, LABEL_COMPONENT: "worker"})  # type: ignore[arg-type]
def pod_event(namespace: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    _child_event(namespace, body, memo, kwargs)


@kopf.on.event("", "v1", "services", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def service_event(namespace: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    _child_event(namespace, body, memo, kwargs)


@kopf.on.event("", "v1", "configmaps", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def config_map_event(namespace: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    _child_event(namespace, body, memo, kwargs)


@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def network_policy_event(namespace: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    _child_event(namespace, body, memo, kwargs)
