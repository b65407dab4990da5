"""Shared test setup: the control-plane plugin (tests/cluster_plugin.py) for `cluster` tests."""

pytest_plugins = ["tests.cluster_plugin"]
