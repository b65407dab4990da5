# Sourced by hack/*.sh and .ci/run: one virtual environment outside the clone, reused.
# MURALIST_CACHE (default ~/.cache/muralist) holds the venv; the control-plane binaries and the real
# node's image store have their own (MURALIST_K8S_CACHE, MURALIST_CONTAINERD_ROOT).
MURALIST_CACHE=${MURALIST_CACHE:-$HOME/.cache/muralist}
VENV=${MURALIST_VENV:-$MURALIST_CACHE/venv}
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

ensure_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        echo "creating the virtual environment in $VENV" >&2
        mkdir -p "$(dirname "$VENV")"
        python3 -m venv "$VENV"
    fi
    # Editable, so the venv follows whichever clone installed it last. pip is quick when
    # everything is already there (the first install downloads torch: several GB).
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -e "$REPO_ROOT/api" -e "$REPO_ROOT[operator,runtime,client,dev]" >&2
}
