"""Shared test setup: the control plane (tests/cluster_plugin.py) for `cluster` and `e2e` tests,
and a Docker engine with a local base image (tests/docker_plugin.py) for `docker` and `e2e`, and
headless Chromium (tests/browser_plugin.py) for the gallery's browser tests, and a stand-in for
the Hugging Face Hub (tests/hub_plugin.py) that every test talks to instead of the real one, and an
S3-compatible server on loopback for the object-storage tests (tests/s3_plugin.py), and Kueue's
manager on the control plane for the queueing tests (tests/kueue_plugin.py).
How the suite splits over pytest-xdist workers: tests/parallel_plugin.py; the end-of-run summary
of setup timings and kept logs, from every worker: tests/summary_plugin.py."""

pytest_plugins = [
    "tests.summary_plugin",
    "tests.parallel_plugin",
    "tests.cluster_plugin",
    "tests.docker_plugin",
    "tests.browser_plugin",
    "tests.hub_plugin",
    "tests.s3_plugin",
    "tests.kueue_plugin",
]
