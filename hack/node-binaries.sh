#!/usr/bin/env bash
# Build the binaries a real node needs beyond the control plane: kubelet (same wrapper module as
# hack/cluster-binaries.sh, sharing its module and build caches) and CoreDNS (plain go install).
#
# Usage: hack/node-binaries.sh
#   Prints the bin directory as the last line of stdout; progress goes to stderr.
#   Same cache dir and stamp convention as hack/cluster-binaries.sh; idempotent.
set -euo pipefail

LOG_PREFIX=node-binaries
# shellcheck source=binaries-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/binaries-lib.sh"
COREDNS_VERSION="${COREDNS_VERSION:-v1.14.7}"

build_kubelet() {
    # Reuses the wrapper module hack/cluster-binaries.sh writes (its go.mod/go.sum).
    local dir="${SRC_DIR}/kubernetes" tmp
    [[ -f "${dir}/go.mod" ]] || "${HACK_DIR}/cluster-binaries.sh" >/dev/null
    tmp="$(mktemp -d "${CACHE_DIR}/tmp.XXXXXX")"
    log "building kubelet ${K8S_VERSION}"
    (cd "${dir}" && go_build -ldflags "$(kube_ldflags)" -o "${tmp}/" k8s.io/kubernetes/cmd/kubelet)
    install_built "${tmp}" "${K8S_VERSION}" kubelet
    rm -rf "${tmp}"
}

main() {
    lock_cache
    is_current kubelet "${K8S_VERSION}" || build_kubelet
    is_current coredns "${COREDNS_VERSION}" ||
        go_install coredns github.com/coredns/coredns "${COREDNS_VERSION}" "-s -w"
    echo "${BIN_DIR}"
}

main "$@"
