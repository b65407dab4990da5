"""Shared test setup: the control plane (tests/cluster_plugin.py) for `cluster` and `e2e` tests,
and a Docker engine with a local base image (tests/docker_plugin.py) for `docker` and `e2e`."""

pytest_plugins = ["tests.cluster_plugin", "tests.docker_plugin"]
