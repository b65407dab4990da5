"""The reconciler's error path: a job whose children cannot be rendered fails with the reason."""

from __future__ import annotations

import pytest
from muralist_operator import handlers
from muralist_operator.decision import CreateJob, Decision
from muralist_operator.render import OperatorSettings
from muralist_runtime.spec.status import DiffusionJobStatus

from tests.builders import make_job


def test_a_render_failure_becomes_a_permanent_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise KeyError("volumes")

    monkeypatch.setattr(handlers, "render_children", broken)
    reconciler = handlers.Reconciler(kube=None, settings=OperatorSettings())  # type: ignore[arg-type]
    decision = Decision(DiffusionJobStatus(), actions=[CreateJob(0, None)])
    with pytest.raises(handlers.RenderFailure, match="cannot build this job's pods: 'volumes'"):
        reconciler._render(make_job().job(), ("ns", "cats"), decision)
    # Without a pod group to create, nothing is rendered.
    assert reconciler._render(make_job().job(), ("ns", "cats"), Decision(DiffusionJobStatus())) is None
