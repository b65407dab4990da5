"""Shared test setup: the control plane (tests/cluster_plugin.py) for `cluster` and `e2e` tests,
and a Docker engine with a local base image (tests/docker_plugin.py) for `docker` and `e2e`, and
headless Chromium (tests/browser_plugin.py) for the gallery's browser tests."""

pytest_plugins = ["tests.cluster_plugin", "tests.docker_plugin", "tests.browser_plugin"]
