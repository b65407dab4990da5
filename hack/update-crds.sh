#!/usr/bin/env bash
# Regenerate the CRD from the API models into crds/ and the chart's crds/ (tests check both).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"
"$VENV/bin/muralist" crd > crds/muralist.dev_diffusionjobs.yaml
cp crds/muralist.dev_diffusionjobs.yaml charts/muralist/crds/muralist.dev_diffusionjobs.yaml
