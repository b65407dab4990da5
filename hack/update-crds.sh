#!/usr/bin/env bash
# Regenerate the CRD from the API models into crds/ and the chart's crds/, and the docs' reference
# pages (hack/docs_reference.py); tests check all three. The CRD defaults only what the skew baseline
# knows (hack/skew_baseline.py writes that list from git: the clone needs the baseline's commit).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"
# The fields the skew baseline's CRD knows: the only ones the CRD may default (operator/muralist_operator/crd.py).
"$VENV/bin/python" hack/skew_baseline.py
"$VENV/bin/muralist" crd > crds/muralist.dev_diffusionjobs.yaml
cp crds/muralist.dev_diffusionjobs.yaml charts/muralist/crds/muralist.dev_diffusionjobs.yaml
"$VENV/bin/python" hack/docs_reference.py
