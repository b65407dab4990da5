"""Small helpers for tests against the real control plane (see tests/cluster_plugin.py).

Pods on the fake kwok nodes follow the fate chosen by their annotations; the stages and the
meaning of each annotation are documented at the top of hack/kwok-stages.yaml.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

FATE_OUTCOME = "fate.muralist.dev/outcome"
FATE_AFTER = "fate.muralist.dev/after"
FATE_EXIT_CODE = "fate.muralist.dev/exit-code"
FATE_MESSAGE = "fate.muralist.dev/message"
FATE_WAITING = "fate.muralist.dev/waiting"
FATE_WAITING_MESSAGE = "fate.muralist.dev/waiting-message"
OUTCOMES = ("succeed", "fail", "run")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30,
    interval: float = 0.1,
    message: str = "condition",
) -> T:
    """Poll `predicate` until it returns a truthy value, and return that value.

    Raises AssertionError naming `message` (and the last value or error seen) on timeout, so a
    failing test says what it was waiting for. Exceptions raised by the predicate count as
    "not yet" (objects that do not exist yet, a CRD still being established).
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # retried until the deadline
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}; last: {last!r}")
        time.sleep(interval)


def fate_annotations(
    outcome: str,
    exit_code: int | None = None,
    message: str | None = None,
    after: str | None = None,
) -> dict[str, str]:
    """Annotations that decide a pod's fate (for pod templates created by a test)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
    annotations = {FATE_OUTCOME: outcome}
    if exit_code is not None:
        annotations[FATE_EXIT_CODE] = str(exit_code)
    if message is not None:
        annotations[FATE_MESSAGE] = message
    if after is not None:
        annotations[FATE_AFTER] = after
    return annotations


def never_starting(reason: str = "ImagePullBackOff", message: str | None = None) -> dict[str, str]:
    """Annotations of a pod that never starts: it stays Pending, its containers waiting for `reason`
    (as a kubelet reports an image it cannot pull, or a missing Secret)."""
    return {FATE_WAITING: reason, **({FATE_WAITING_MESSAGE: message} if message is not None else {})}


def set_pod_fate(
    core_v1: Any,
    name: str,
    namespace: str,
    outcome: str,
    exit_code: int | None = None,
    message: str | None = None,
    after: str | None = None,
) -> Any:
    """Decide (or change) the fate of an existing pod; `core_v1` is a kubernetes CoreV1Api.

    Options left as None are removed from the pod, so an earlier exit code or message does not
    leak into the new fate. kwok re-evaluates the pod on this update.
    """
    annotations: dict[str, str | None] = dict.fromkeys((FATE_EXIT_CODE, FATE_MESSAGE, FATE_AFTER))
    annotations.update(fate_annotations(outcome, exit_code, message, after))
    return core_v1.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})


def pod_phase(core_v1: Any, name: str, namespace: str) -> str | None:
    return core_v1.read_namespaced_pod(name, namespace).status.phase
