#!/usr/bin/env bash
# Render the CPU quickstart on this machine: the tiny trained shapes Flux (shipped in the runtime),
# 2 processes under torchrun, a gallery in ./muralist-output/quickstart/index.html. No cluster, no GPU.
set -euo pipefail
source "$(dirname "$0")/env.sh"
ensure_venv
cd "$REPO_ROOT"
exec "$VENV/bin/muralist" run examples/quickstart-cpu.yaml "$@"
