"""`muralist submit` and `status`: exit codes a pipeline step can act on, API errors as one line."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException
from muralist import JobDeleted, JobFailed, WaitTimeout
from muralist_api.status import DiffusionJobStatus
from muralist_cli import build_parser
from muralist_cli.jobs import (
    EXIT_DELETED,
    EXIT_FAILED,
    EXIT_NOT_SUBMITTED,
    EXIT_SUCCEEDED,
    EXIT_TIMEOUT,
    api_error_text,
    exit_code,
)

RUNNING = DiffusionJobStatus(phase="Running")


@pytest.mark.parametrize(("outcome", "code"), [
    (DiffusionJobStatus(phase="Succeeded"), EXIT_SUCCEEDED),
    (DiffusionJobStatus(phase="Failed"), EXIT_FAILED),
    (JobFailed("cats", DiffusionJobStatus(phase="Failed")), EXIT_FAILED),
    (WaitTimeout("cats", 5, RUNNING), EXIT_TIMEOUT),
    (JobDeleted("cats", RUNNING), EXIT_DELETED),
    (ApiException(status=404, reason="Not Found"), EXIT_NOT_SUBMITTED),
])
def test_exit_code_is_the_outcome(outcome: object, code: int) -> None:
    assert exit_code(outcome) == code


def test_the_outcomes_have_distinct_codes() -> None:
    codes = [EXIT_SUCCEEDED, EXIT_FAILED, EXIT_NOT_SUBMITTED, EXIT_DELETED, EXIT_TIMEOUT]
    assert len(set(codes)) == len(codes)


def test_api_error_is_the_servers_message() -> None:
    error = ApiException(status=422, reason="Unprocessable Entity")
    error.body = '{"kind": "Status", "message": "spec.generation cannot change"}'
    assert api_error_text(error) == "422 Unprocessable Entity: spec.generation cannot change"
    assert api_error_text(ApiException(status=500, reason="Internal Server Error")) == "500 Internal Server Error"


def test_submit_and_status_take_the_connection_options() -> None:
    args = build_parser().parse_args(["submit", "job.yaml", "--follow", "--timeout", "30", "-n", "team",
                                      "--kubeconfig", "/k", "--context", "c"])
    assert (args.follow, args.timeout, args.namespace, args.kubeconfig, args.context) == (True, 30, "team", "/k", "c")
    args = build_parser().parse_args(["status", "cats", "--namespace", "team"])
    assert (args.name, args.namespace, args.kubeconfig) == ("cats", "team", None)
