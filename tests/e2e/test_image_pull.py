"""A pod whose image cannot be pulled, on a real node: the kubelet's own ErrImagePull and
ImagePullBackOff, named in the job's status, and the job failed with that reason at its start
timeout (what kwok's `fate.muralist.dev/waiting` fate plays in the cluster tier:
tests/cluster/test_operator.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import make_job
from tests.kube_helpers import wait_for
from tests.operator_helpers import DJ

pytestmark = pytest.mark.e2e

# `.invalid` never resolves (RFC 2606): the node's containerd fails at once, and nothing is pulled.
MISSING_IMAGE = "registry.muralist.invalid/runtime:missing"
PULL_REASONS = ("ErrImagePull", "ImagePullBackOff")


def test_an_image_that_cannot_be_pulled_is_named_and_fails_the_job(real_dj: DJ) -> None:
    real_dj.create(make_job("nopull").set("spec.image", MISSING_IMAGE).run_policy(startTimeoutSeconds=20).obj())

    def waiting() -> dict[str, Any] | None:
        found = [c for c in real_dj.status("nopull").get("conditions") or [] if c["type"] == "PodsNotStarting"]
        return found[0] if found and found[0]["reason"] in PULL_REASONS else None

    named = wait_for(waiting, timeout=60, message="the pull failure in the job's status")
    assert MISSING_IMAGE in named["message"] and named["message"].startswith("index 0 (pod nopull-0-")
    failed = real_dj.wait_phase("nopull", "Failed", timeout=60)
    reasons = [c["reason"] for c in failed["conditions"] if c["type"] == "Failed"]
    assert len(reasons) == 1 and reasons[0] in PULL_REASONS, reasons
    assert "runPolicy.startTimeoutSeconds=20" in failed["message"]
