# Sourced by hack/*.sh and .ci/run: one virtual environment outside the clone, reused, installed from
# the lock (locks/all.txt).
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
    # Nothing to do when the venv holds exactly what locks/all.txt pins and this clone's packages
    # editable (hack/venv_check.py: a fraction of a second, where pip takes seconds).
    if "$VENV/bin/python" "$REPO_ROOT/hack/venv_check.py" "$REPO_ROOT/locks/all.txt" "$REPO_ROOT/api" "$REPO_ROOT"; then
        return 0
    fi
    # The locked third-party packages, each checked against its hashes (the first install downloads
    # torch: several GB); then this clone's packages, editable (so the venv follows whichever clone
    # installed it last) and without dependencies: the lock has them (bash hack/lock.sh refreshes it).
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --require-hashes -r "$REPO_ROOT/locks/all.txt" >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -e "$REPO_ROOT/api" -e "$REPO_ROOT" >&2
}
