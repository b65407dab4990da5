#!/usr/bin/env bash
# The whole test suite: lint, import contracts, unit, runtime (real torchrun on CPU) and
# cluster tests (a real control plane built from Go modules; the first build takes minutes),
# image tests and end-to-end tests on a real node (Docker, containerd, kubelet; root).
set -euo pipefail
source "$(dirname "$0")/env.sh"
ensure_venv
cd "$REPO_ROOT"
MURALIST_K8S_BIN=$(bash hack/cluster-binaries.sh)
export MURALIST_K8S_BIN
# Cluster tests fail instead of skipping when their control plane cannot start.
export MURALIST_REQUIRE_CLUSTER=1
# Likewise the image tests: they install and start a Docker engine when none runs (as root).
export MURALIST_REQUIRE_DOCKER=1
# And the real-node tests (tests/e2e, root): containerd, kubelet and CoreDNS run real pods.
export MURALIST_REQUIRE_E2E=1
# And the gallery's browser test (Debian's chromium and chromedriver, installed when missing).
export MURALIST_REQUIRE_BROWSER=1
# ruff, lint-imports, mypy and the docs build (also the pre-commit hooks) run beside pytest's start,
# one core for ~25 s; their report follows pytest's, and a failure fails the run.
checks_log=$(mktemp)
bash hack/checks.sh > "$checks_log" 2>&1 &
checks_pid=$!
# Three pytest-xdist workers by default: the real-node chain (image builds and pods) on one, the
# rest beside it (tests/parallel_plugin.py). On 2 cores, with the runtime tests' ranks forked from
# a warm zygote, a clean clone's .ci/run took 12.6 min with three workers against 15.3 with two
# (2026-12-03): the real-node chain waits on pods, which leaves a third of a core idle under two;
# MURALIST_TEST_WORKERS=0 runs one process (for -s, pdb, or a single test): docs/development/tests.md.
workers=${MURALIST_TEST_WORKERS:-3}
parallel=()
if [ "$workers" != 0 ]; then
    parallel=(-n "$workers" --dist loadscope --no-loadscope-reorder)
fi
# The 30 slowest steps close every run: where the CI budget (warm <= 15 min) goes.
set +e
"$VENV/bin/python" -m pytest "${parallel[@]}" --durations=30 "$@"
status=$?
wait "$checks_pid"
checks_status=$?
set -e
cat "$checks_log"
rm -f "$checks_log"
if [ "$checks_status" -ne 0 ]; then
    echo "hack/checks.sh failed (exit $checks_status): see its report above" >&2
    [ "$status" -ne 0 ] || status=$checks_status
fi
exit "$status"
