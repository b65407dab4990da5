#!/usr/bin/env bash
# The GPU proof in one command: every GPU-only path of the runtime on one GPU, one Markdown table
# (path | setting | figure | verdict), exit 1 when a path fails. See benchmarks/README.md.
#
#   bash hack/gpu-check.sh [--dry-run] [--out DIR] [--budget SECONDS]   # the check (GPU, or CPU dry run)
#   bash hack/gpu-check.sh --fetch-wheels                                 # on a machine with PyPI: see below
#
# The interpreter, first that works:
#   1. the project venv ($MURALIST_VENV, else ${MURALIST_CACHE:-~/.cache/muralist}/venv, hack/env.sh)
#      when it already imports torch, diffusers and pydantic (and, without --dry-run, sees CUDA):
#      reused as it is, no pip (CI's test run has just run ensure_venv);
#   2. python3 with a CUDA torch plus the wheels in ${MURALIST_GPU_WHEELS:-build/gpu-wheels},
#      installed offline (--no-index) into ${MURALIST_CACHE}/gpu-check-site once: a lent GPU machine
#      reaches no package registry, and its image has torch, transformers and accelerate but not
#      diffusers or pydantic. `--fetch-wheels` downloads those wheels here (CPython 3.12, x86-64
#      manylinux, the versions of the project venv) into that folder, which `build/` keeps out
#      of git; the device tool's run then carries it (carry: ["build/gpu-wheels"]);
#   3. ensure_venv (creates the venv, installs the project's extras from PyPI), then 1.
# This checkout's cli/, operator/ and runtime/ go first on PYTHONPATH in every case, so the code
# checked is the tree's, whichever clone the editable venv install points at.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"

WHEELS=${MURALIST_GPU_WHEELS:-$REPO_ROOT/build/gpu-wheels}
# What the lent GPU image lacks for the image-job paths (the lent machine's package list, as its provider documents it): diffusers and
# its importlib-metadata, pydantic and its parts; typing-extensions and zipp as new as pydantic
# and importlib-metadata need. Everything else (torch, transformers, accelerate, safetensors,
# huggingface-hub, tokenizers, numpy, Pillow, PyYAML, tqdm, psutil) is in that image.
WHEEL_PACKAGES=(diffusers importlib-metadata zipp pydantic pydantic-core annotated-types typing-inspection
                typing-extensions)

dry=0
fetch=0
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=1; args+=("$1") ;;
        --out) args+=("$1" "$2"); shift ;;
        --budget) args+=("$1" "$2"); shift ;;
        --fetch-wheels) fetch=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

ORIG_PYTHONPATH=${PYTHONPATH:-}
TREE="$REPO_ROOT/api:$REPO_ROOT/cli:$REPO_ROOT/operator:$REPO_ROOT/runtime"
export PYTHONPATH="$TREE${ORIG_PYTHONPATH:+:$ORIG_PYTHONPATH}"
export PYTHONUNBUFFERED=1

fetch_wheels() {
    ensure_venv
    local specs=() name version
    for name in "${WHEEL_PACKAGES[@]}"; do
        version=$("$VENV/bin/python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
        specs+=("$name==$version")
    done
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS"
    "$VENV/bin/pip" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "${MURALIST_GPU_WHEELS_PYTHON:-3.12}" --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" "${specs[@]}"
    echo "wheels for the GPU machine in $WHEELS ($(du -sh "$WHEELS" | cut -f1)):" >&2
    ls "$WHEELS" >&2
}

if [ "$fetch" = 1 ]; then
    fetch_wheels
    exit 0
fi

probe() {  # can interpreter $1 run the check? Cheap: finds modules without importing them (torch: on GPU)
    local code='import importlib.util as u, sys
missing = [n for n in ("torch", "diffusers", "transformers", "pydantic", "yaml", "muralist_runtime", "muralist_cli")
           if u.find_spec(n) is None]
if missing:
    sys.exit("missing: " + ", ".join(missing))'
    [ "$dry" = 1 ] || code="$code
import torch
if not torch.cuda.is_available():
    sys.exit(f'torch {torch.__version__} sees no CUDA device')"
    "$1" -c "$code" 2>&1
}

PY=""
probed=0
if [ -x "$VENV/bin/python" ] && probe "$VENV/bin/python" >/dev/null; then
    PY="$VENV/bin/python"
    probed=1
elif compgen -G "$WHEELS/*.whl" >/dev/null && command -v python3 >/dev/null \
        && python3 -c 'import torch' >/dev/null 2>&1; then
    stamp=$(ls "$WHEELS" | sha1sum | cut -c1-12)
    SITE="$MURALIST_CACHE/gpu-check-site/$stamp"
    if [ ! -f "$SITE/.complete" ]; then
        echo "gpu-check.sh: installing $(ls "$WHEELS" | wc -l) wheels offline into $SITE" >&2
        rm -rf "$SITE"
        python3 -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile \
            --no-cache-dir --target "$SITE" "$WHEELS"/*.whl >&2
        touch "$SITE/.complete"
    fi
    export PYTHONPATH="$TREE:$SITE${ORIG_PYTHONPATH:+:$ORIG_PYTHONPATH}"
    PY=$(command -v python3)
else
    ensure_venv
    PY="$VENV/bin/python"
fi
if [ "$probed" = 0 ] && ! why=$(probe "$PY"); then
    echo "gpu-check.sh: $PY cannot run the check: $why" >&2
    exit 2
fi
echo "gpu-check.sh: running with $PY" >&2

# Hard limit around the script's own budget (its checks are time-boxed inside it): 9 minutes on
# a GPU, 7.5 on the dry run (~90 s on 2 idle cores, half of it the compile's CPU C++ builds).
# Killed, it still leaves its rows: print those.
if [ "$dry" = 1 ]; then limit=450; else limit=540; fi
out_dir=""
for ((i = 0; i < ${#args[@]}; i++)); do
    [ "${args[$i]}" = "--out" ] && out_dir=${args[$((i + 1))]}
done
if [ -z "$out_dir" ]; then
    out_dir=$(mktemp -d -t muralist-gpu-check-out.XXXXXX)
    args+=(--out "$out_dir")
fi
set +e
timeout --signal=TERM --kill-after=20 "$limit" "$PY" benchmarks/gpu_check.py "${args[@]}"
code=$?
set -e
if [ "$code" = 124 ] || [ "$code" = 137 ] || [ "$code" = 143 ]; then
    "$PY" benchmarks/gpu_check.py --table "$out_dir/gpu-check.jsonl" --killed-after "$limit" || true
    exit 1
fi
exit "$code"
