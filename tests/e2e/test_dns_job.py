"""Two pods of an Indexed Job find each other by `<job>-<index>.<service>` and talk over TCP."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import RealCluster

pytestmark = pytest.mark.e2e

# perl-base is in every Debian (minbase included): index 0 listens, index 1 connects by DNS name.
SCRIPT = r"""
set -eu
peer=pair-$((1 - JOB_COMPLETION_INDEX)).pair
for i in $(seq 120); do getent hosts "$peer" && break; sleep 1; done
getent hosts "$peer"
if [ "$JOB_COMPLETION_INDEX" = 0 ]; then
  exec perl -MIO::Socket::INET -e '
    my $s = IO::Socket::INET->new(LocalPort => 7000, Listen => 1, ReuseAddr => 1) or die "listen: $!";
    my $c = $s->accept; my $line = <$c>; print "got: $line"; exit($line =~ /^hello from 1/ ? 0 : 1)'
else
  exec perl -MIO::Socket::INET -e '
    for (1..60) { my $c = IO::Socket::INET->new(PeerAddr => "pair-0.pair", PeerPort => 7000);
      if ($c) { print $c "hello from 1\n"; close $c; print "sent\n"; exit 0 } sleep 1 } die "connect: $!"'
fi
"""


def manifests(image: str) -> str:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "pair"},
        "spec": {
            "clusterIP": "None",
            "selector": {"batch.kubernetes.io/job-name": "pair"},
            "publishNotReadyAddresses": True,
        },
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "pair"},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "subdomain": "pair",
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                                        "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "c",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["bash", "-c", SCRIPT],
                        }
                    ],
                }
            },
        },
    }
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [svc, job]})


def test_indexed_job_pods_reach_each_other_by_dns(real_cluster: RealCluster, node_base_image: str) -> None:
    real_cluster.kubectl("apply", "-f", "-", input=manifests(node_base_image))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status = json.loads(real_cluster.kubectl("get", "job", "pair", "-o", "json").stdout)["status"]
        if status.get("succeeded") == 2 or status.get("failed"):
            break
        time.sleep(1)
    logs = real_cluster.kubectl("logs", "-l", "batch.kubernetes.io/job-name=pair", "--prefix", check=False)
    assert status.get("succeeded") == 2, f"job status {status}\n{logs.stdout}{logs.stderr}"
    assert "got: hello from 1" in logs.stdout and "sent" in logs.stdout, logs.stdout
