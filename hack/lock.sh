#!/usr/bin/env bash
# Refresh the lock files in locks/ (every third-party package pinned, each pin with its hashes) from the
# requirements in pyproject.toml and api/pyproject.toml, with uv (pinned below, installed on first use into
# $MURALIST_CACHE/lock-tools). One command; commit what it changes with the change that needed it:
#
#   bash hack/lock.sh                           # after a requirement changed: every pin that still fits is kept
#   bash hack/lock.sh --upgrade-package torch   # one package (and what it needs) to its newest allowed version
#   bash hack/lock.sh --upgrade                 # everything to the newest versions the requirements allow
#
# Extra arguments go to the resolution of locks/all.txt (`uv pip compile`). The locks:
#   locks/all.txt       api/ and the root package with every extra: the test venv (hack/env.sh ensure_venv,
#                       which hack/test.sh, .ci/run and hack/quickstart.sh use). Python >= 3.11.5 (pymdown-extensions).
#   locks/operator.txt  the operator image (Dockerfile target `operator`), the versions of all.txt
#   locks/runtime.txt   the runtime image (target `runtime`), the versions of all.txt
# Universal: markers pick each platform's wheels (Linux x86_64 and aarch64 with CUDA torch, macOS, Windows),
# from Python 3.11 on (Debian bookworm's python3 is 3.11.2). The editable packages of this repository stay out
# of the locks: ensure_venv and the Dockerfile install them with --no-deps after the lock.
set -euo pipefail
source "$(dirname "$0")/env.sh"
UV_VERSION=0.13.9
TOOLS=$MURALIST_CACHE/lock-tools
if [ "$("$TOOLS/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi
cd "$REPO_ROOT"

compile() { # lock file, extras, lowest Python, more arguments for uv
    local lock=$1 extras=$2 python=$3
    shift 3
    printf -- '-e ./api\n-e .[%s]\n' "$extras" | "$TOOLS/bin/uv" pip compile - --quiet --universal \
        --python-version "$python" --generate-hashes --no-emit-package muralist --no-emit-package muralist-api \
        --custom-compile-command "bash hack/lock.sh" -o "$lock" "$@"
}

compile locks/all.txt operator,runtime,client,dev 3.11.5 "$@"
# Each image's lock holds the versions all.txt pins (its pins are the constraints), so CI tests what ships.
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
grep -E '^[A-Za-z0-9]' locks/all.txt | sed 's/ *\\$//' >"$pins"
for image in operator runtime; do
    compile "locks/$image.txt" "$image" 3.11 --constraint "$pins"
    sed -i "s|-c $pins\$|-c locks/all.txt|" "locks/$image.txt"  # the pins' source, not their temp copy
done
