"""A DiffusionJob that a newer Muralist wrote (skew.py): fields this operator does not know never fail
or reset a job; a job that runs goes on without them, one that has not started waits, and a status it
cannot read is kept and reported. Pure functions first, then the reconciler against a fake API."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from muralist_api.contract.versions import UnknownField, build
from muralist_api.rules.problems import ValidationProblem
from muralist_api.status import DiffusionJobStatus, Phase
from muralist_operator import skew
from muralist_operator.decision import Decision
from muralist_operator.indexes import Index
from muralist_operator.reconciler import Reconciler
from muralist_operator.settings import OperatorSettings

from tests.builders import make_job
from tests.views import NOW, job_view, pod

KEY = ("ns", "cats")


def manifest(**spec: Any) -> dict[str, Any]:
    body = make_job("cats").obj()
    for section, fields in spec.items():
        body["spec"].setdefault(section, {}).update(fields)
    return body


# -- reading


def test_a_status_field_of_a_newer_operator_is_set_aside_and_the_rest_read() -> None:
    raw = {"phase": "Running", "restarts": 2, "startupReason": "ImagePullBackOff"}
    reading = skew.read_status(raw)
    assert reading.status is not None and reading.status.phase == Phase.RUNNING and reading.status.restarts == 2
    assert reading.known == {"phase": "Running", "restarts": 2}
    assert reading.unknown == [UnknownField("status.startupReason", "ImagePullBackOff")]


@pytest.mark.parametrize(("raw", "named"), [({"phase": "Queued", "restarts": 2}, "status.phase"),
                                            ({"phase": "Running", "restarts": "two", "later": 1}, "status.restarts")])
def test_a_status_this_operator_cannot_read_is_not_reset(raw: dict[str, Any], named: str) -> None:
    reading = skew.read_status(raw)
    assert reading.status is None and reading.known == raw
    assert reading.problems[0].startswith(named)
    assert skew.unreadable_message(reading).startswith(named) and build() in skew.unreadable_message(reading)


def test_a_started_job_is_read_without_the_spec_fields_this_operator_does_not_know() -> None:
    job, unknown = skew.read_job(manifest(runPolicy={"futureRetries": 2}), started=True)
    assert job.metadata.name == "cats" and unknown == [UnknownField("spec.runPolicy.futureRetries", 2)]


def test_a_job_not_started_waits_for_an_operator_that_knows_its_fields() -> None:
    with pytest.raises(skew.NewerSpec) as newer:
        skew.read_job(manifest(runPolicy={"futureRetries": 2}), started=False)
    assert str(newer.value).startswith("spec.runPolicy.futureRetries: not known to this operator (muralist ")


def test_a_job_that_is_no_job_without_the_unknown_fields_waits_even_when_started() -> None:
    body = make_job("cats").obj()
    body["spec"].pop("prompts")
    body["spec"]["futurePrompts"] = {"url": "https://example.com/p.txt"}  # a newer source of prompts
    with pytest.raises(skew.NewerSpec):
        skew.read_job(body, started=True)


def test_other_problems_are_still_problems() -> None:
    with pytest.raises(ValidationProblem):
        skew.read_job(manifest(generation={"steps": 0}), started=True)
    # Beside a field it does not know, this operator cannot tell a problem from a consequence of
    # that field: it leaves the job to an operator that knows it.
    with pytest.raises(skew.NewerSpec):
        skew.read_job(manifest(generation={"steps": 0, "futureGuard": True}), started=True)


def test_the_condition_names_the_fields_once_and_goes_with_them() -> None:
    fields = [UnknownField("spec.runPolicy.futureRetries", 2)]
    decision = Decision(DiffusionJobStatus(phase=Phase.RUNNING))
    skew.note_unknown(decision, fields, NOW, 3)
    [condition] = decision.status.conditions
    assert (condition.type, condition.status, condition.reason) == ("VersionSkew", "True", "UnknownFields")
    assert condition.message.startswith("spec.runPolicy.futureRetries: not known to this operator")
    assert [e.reason for e in decision.events] == ["UnknownFields"]
    again = Decision(decision.status.model_copy(deep=True))
    skew.note_unknown(again, fields, NOW, 3)
    assert again.events == [] and again.status == decision.status
    skew.note_unknown(again, [], NOW, 3)
    assert again.status.conditions == []


# -- the reconciler


class FakeKube:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body, self.patches, self.created, self.events = body, [], [], []

    def get_diffusion_job(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.body)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(status)
        self.body["status"] = {**self.body.get("status", {}), **status}  # a merge patch keeps other keys
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.body)

    def create(self, obj: dict[str, Any], owner: dict[str, Any]) -> bool:
        self.created.append(obj["kind"])
        return True

    def post_event(self, owner: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((reason, message))


def reconciler(body: dict[str, Any], running: bool) -> tuple[Reconciler, FakeKube]:
    body["metadata"].update(namespace="ns", generation=1, resourceVersion="1")
    kube = FakeKube(body)
    r = Reconciler(kube, OperatorSettings())  # type: ignore[arg-type]
    if running:
        r.indexes.remember({Index.JOBS: {KEY: [job_view()]}, Index.PODS: {KEY: [pod(0)]}}, listed=False)
    return r, kube


def test_a_running_job_with_a_field_of_a_newer_crd_goes_on_and_says_so() -> None:
    body = manifest(runPolicy={"futureRetries": 2})
    body["status"] = {"phase": "Running", "startTime": "2026-11-30T11:59:00Z"}
    r, kube = reconciler(body, running=True)
    r.reconcile(*KEY, fresh=True)
    status = kube.body["status"]
    assert status["phase"] == "Running"
    skewed = [c for c in status["conditions"] if c["type"] == "VersionSkew"]
    assert skewed and "spec.runPolicy.futureRetries" in skewed[0]["message"]
    r.reconcile(*KEY, fresh=True)
    assert [reason for reason, _ in kube.events].count("UnknownFields") == 1
    assert "Failed" not in [c["type"] for c in kube.body["status"]["conditions"]]


def admitted_under_older_rules() -> dict[str, Any]:
    """A running job that this operator's rules refuse: two pods on the default output (an emptyDir each),
    admitted by an operator before that rule."""
    body = make_job("cats").world(nodes=2, gpus=1).obj()
    del body["spec"]["output"]
    return body


def test_a_started_job_that_rules_added_since_refuse_is_read_field_by_field() -> None:
    with pytest.raises(ValidationProblem) as refused:
        skew.read_job(admitted_under_older_rules(), started=True)
    job, rules = skew.read_admitted(admitted_under_older_rules(), True, refused.value)
    assert job.spec.parallelism.nodes == 2 and rules[0].startswith("spec.output: spec.output sets no volume")
    with pytest.raises(ValidationProblem):
        skew.read_admitted(admitted_under_older_rules(), False, refused.value)
    with pytest.raises(ValidationProblem):  # a field no version takes is no older rule's
        skew.read_admitted(manifest(generation={"steps": 0}), True, refused.value)


def test_an_upgrade_never_fails_a_running_job_that_its_new_rules_refuse() -> None:
    body = admitted_under_older_rules()
    body["status"] = {"phase": "Running", "startTime": "2026-11-30T11:59:00Z"}
    r, kube = reconciler(body, running=True)
    r.reconcile(*KEY, fresh=True)
    status = kube.body["status"]
    assert status["phase"] == "Running"
    [skewed] = [c for c in status["conditions"] if c["type"] == "VersionSkew"]
    assert skewed["reason"] == "RulesChanged" and "spec.output" in skewed["message"]
    assert [reason for reason, _ in kube.events] == ["RulesChanged"]
    # A new job of that spec is refused.
    fresh, kube = reconciler(admitted_under_older_rules(), running=False)
    fresh.reconcile(*KEY, fresh=True)
    assert kube.body["status"]["phase"] == "Failed" and kube.created == []


def test_a_new_job_with_a_field_of_a_newer_crd_waits_and_creates_nothing() -> None:
    r, kube = reconciler(manifest(runPolicy={"futureRetries": 2}), running=False)
    r.reconcile(*KEY, fresh=True)
    r.reconcile(*KEY, fresh=True)
    assert kube.created == [] and kube.body["status"]["phase"] == "Pending"
    assert "spec.runPolicy.futureRetries: not known to this operator" in kube.body["status"]["message"]
    assert [reason for reason, _ in kube.events] == ["UnknownFields"]


def test_a_status_field_of_a_newer_operator_stays_and_costs_no_write() -> None:
    body = make_job("cats").obj()
    r, kube = reconciler(body, running=True)
    r.reconcile(*KEY, fresh=True)  # this operator's own status
    kube.body["status"]["futureCount"] = 3  # what a newer operator added (then it was rolled back)
    kube.patches.clear()
    r.reconcile(*KEY, fresh=True)
    assert kube.body["status"]["futureCount"] == 3 and kube.body["status"]["phase"] == "Running"
    assert all("futureCount" not in p for p in kube.patches)
    written = len(kube.patches)
    r.reconcile(*KEY, fresh=True)
    assert len(kube.patches) == written, "nothing changed: nothing written"


def test_a_status_this_operator_cannot_read_is_kept_and_reported_once() -> None:
    body = make_job("cats").obj()
    body["status"] = {"phase": "Queued", "restarts": 2, "startTime": "2026-11-30T11:59:00Z"}
    r, kube = reconciler(body, running=True)
    r.reconcile(*KEY, fresh=True)
    r.reconcile(*KEY, fresh=True)
    assert kube.patches == [] and kube.created == []
    assert kube.body["status"] == {"phase": "Queued", "restarts": 2, "startTime": "2026-11-30T11:59:00Z"}
    [(reason, message)] = kube.events
    assert reason == "StatusUnreadable" and message.startswith("status.phase")
