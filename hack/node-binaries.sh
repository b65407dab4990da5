#!/usr/bin/env bash
# Build the binaries a real node needs beyond the control plane: kubelet (same wrapper module as
# hack/cluster-binaries.sh, sharing its module and build caches) and CoreDNS (plain go install).
#
# Usage: hack/node-binaries.sh
#   Prints the bin directory as the last line of stdout; progress goes to stderr.
#   Same cache dir and stamp convention as hack/cluster-binaries.sh; idempotent.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"
COREDNS_VERSION="${COREDNS_VERSION:-v1.14.7}"

CACHE_DIR="${MURALIST_K8S_CACHE:-$HOME/.cache/muralist/k8s}/${K8S_VERSION}"
BIN_DIR="${CACHE_DIR}/bin"
SRC_DIR="${CACHE_DIR}/src"

log() { echo "[node-binaries] $*" >&2; }
is_current() { [[ -x "${BIN_DIR}/$1" && "$(cat "${BIN_DIR}/.$1.version" 2>/dev/null)" == "$2" ]]; }
install_built() {
    local tmp="$1" version="$2" name
    shift 2
    for name in "$@"; do
        mv -f "${tmp}/${name}" "${BIN_DIR}/${name}"
        echo "${version}" >"${BIN_DIR}/.${name}.version"
        log "built ${name} ${version} ($(du -h "${BIN_DIR}/${name}" | cut -f1))"
    done
}

build_kubelet() {
    # Reuses the wrapper module hack/cluster-binaries.sh writes (its go.mod/go.sum).
    local dir="${SRC_DIR}/kubernetes" tmp minor="${K8S_VERSION#v1.}" pkg
    minor="${minor%%.*}"
    [[ -f "${dir}/go.mod" ]] || "${HACK_DIR}/cluster-binaries.sh" >/dev/null
    local ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1"
        ldflags+=" -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"
        ldflags+=" -X ${pkg}.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    tmp="$(mktemp -d "${CACHE_DIR}/tmp.XXXXXX")"
    log "building kubelet ${K8S_VERSION}"
    (cd "${dir}" && CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "${ldflags}" \
        -o "${tmp}/" k8s.io/kubernetes/cmd/kubelet)
    install_built "${tmp}" "${K8S_VERSION}" kubelet
    rm -rf "${tmp}"
}

build_coredns() {
    local tmp
    tmp="$(mktemp -d "${CACHE_DIR}/tmp.XXXXXX")"
    log "building coredns ${COREDNS_VERSION}"
    (cd "${tmp}" && CGO_ENABLED=0 GOBIN="${tmp}" go install -trimpath -ldflags "-s -w" \
        "github.com/coredns/coredns@${COREDNS_VERSION}")
    install_built "${tmp}" "${COREDNS_VERSION}" coredns
    rm -rf "${tmp}"
}

main() {
    mkdir -p "${BIN_DIR}"
    exec 9>"${CACHE_DIR}/.lock"
    flock 9
    is_current kubelet "${K8S_VERSION}" || build_kubelet
    is_current coredns "${COREDNS_VERSION}" || build_coredns
    echo "${BIN_DIR}"
}

main "$@"
