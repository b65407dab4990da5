#!/usr/bin/env bash
# Regenerate the CRD from the API models into crds/ and the chart's crds/, and the docs' reference
# pages (hack/docs_reference.py); tests check all three.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"
"$VENV/bin/muralist" crd > crds/muralist.dev_diffusionjobs.yaml
cp crds/muralist.dev_diffusionjobs.yaml charts/muralist/crds/muralist.dev_diffusionjobs.yaml
"$VENV/bin/python" hack/docs_reference.py
