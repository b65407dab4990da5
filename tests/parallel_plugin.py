"""pytest plugin: how the suite splits over pytest-xdist workers (`hack/test.sh` runs two: `-n 2 --dist
loadscope --no-loadscope-reorder`). This plugin says what a scope is.

The real-node chain (the `docker` and `e2e` tests, all in REAL_NODE_DIRS: image builds, the
node's image store, pods that start, render and get killed) is one scope, run by one worker,
first: it waits on image layers and pods most of its time, so the other worker runs the
CPU-bound rest beside it. Two workers could not share one Docker engine or one real node anyway
(the real node is one per machine). Every other test file is a scope of its own, so its module
fixtures (a torchrun run that several tests read) run once; a session fixture (a control plane,
a tiny model) runs once per worker that needs it.

The scope is read from the test's path, not from its markers: xdist's scheduler sees only node
ids, and xdist's own marker-based grouping (`--dist loadgroup`, which rewrites node ids) has no
effect under pytest >= 9.2, whose node ids are no longer the attribute xdist rewrites. So a test
marked `docker` or `e2e` outside REAL_NODE_DIRS fails, saying where it belongs.

Without xdist (`pytest` alone, or `MURALIST_TEST_WORKERS=0 hack/test.sh`) only the order stays: the real-node
chain first.
"""

from __future__ import annotations

from typing import Any

import pytest

REAL_NODE_DIRS = ("tests/e2e/", "tests/image/")
REAL_NODE_MARKERS = ("docker", "e2e")
REAL_NODE_SCOPE = "real-node"


def scope_of(nodeid: str) -> str:
    """The scope of a test by its node id: the real-node chain, or the test's file."""
    path = nodeid.split("::", 1)[0]
    return REAL_NODE_SCOPE if path.startswith(REAL_NODE_DIRS) else path


def misplaced(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in REAL_NODE_MARKERS) and scope_of(item.nodeid) != REAL_NODE_SCOPE


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Stable: within each part the collection order stays (every worker must collect the same order).
    items.sort(key=lambda item: scope_of(item.nodeid) != REAL_NODE_SCOPE)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if misplaced(item):
        pytest.fail(f"a test marked {' or '.join(REAL_NODE_MARKERS)} must live in {', '.join(REAL_NODE_DIRS)}: "
                    "tests/parallel_plugin.py runs the real-node chain on one worker by its path", pytrace=False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class RealNodeApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return RealNodeApart(config, log)
