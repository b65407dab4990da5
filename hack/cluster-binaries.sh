#!/usr/bin/env bash
# Build the binaries of Muralist's test clusters from Go modules, at pinned versions:
#   control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm,
#   and kwokctl (sigs.k8s.io/kwok's cluster tool, same module and version as kwok);
#   Kueue's manager (`kueue`) with its CRDs (bin/kueue-crds/, copied from the module at build time
#   so the tests that install them need no network);
#   a real node (hack/real-node.py): kubelet, and CoreDNS for the cluster domain;
#   for the chart's monitoring: promtool (Prometheus' rule checker), and dashboard-check
#   (hack/dashboard-check: the dashboard JSON against grafana-foundation-sdk's dashboard types).
#
# Usage: hack/cluster-binaries.sh
#   Prints the bin directory as the last line of stdout; progress goes to stderr.
#   Versions come from hack/versions.env. Output goes to a cache outside the clone:
#     ${MURALIST_K8S_CACHE:-$HOME/.cache/muralist/k8s}/<k8s-version>/bin
#   Idempotent: a binary whose stamp matches its pinned version is not rebuilt, so a warm
#   cache returns in well under a second without invoking go.
# A cold build downloads the modules (through GOPROXY) and compiles for a long while on few
# cores (tens of minutes on 2 cores); the Go module and build caches keep their defaults.
set -euo pipefail

LOG_PREFIX=cluster-binaries
# shellcheck source=binaries-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/binaries-lib.sh"

build_etcd() {
    # etcd's own go.mod files use local replace directives, so `go install` cannot build it;
    # a wrapper module requiring the server and its sibling modules at one tag can.
    local dir="${SRC_DIR}/etcd" tmp
    mkdir -p "${dir}"
    cat >"${dir}/go.mod" <<EOF
module muralist.dev/hack/etcd-wrapper

go 1.26.0

require (
	go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
	go.etcd.io/etcd/api/v3 ${ETCD_VERSION}
	go.etcd.io/etcd/client/pkg/v3 ${ETCD_VERSION}
	go.etcd.io/etcd/client/v3 ${ETCD_VERSION}
	go.etcd.io/etcd/pkg/v3 ${ETCD_VERSION}
)
EOF
    tmp="$(mktemp -d "${CACHE_DIR}/tmp.XXXXXX")"
    log "building etcd ${ETCD_VERSION}"
    (cd "${dir}" && go_build -ldflags "-s -w" -o "${tmp}/etcd" go.etcd.io/etcd/server/v3)
    install_built "${tmp}" "${ETCD_VERSION}" etcd
    rm -rf "${tmp}"
}

# Print "replace" lines for the staging modules k8s.io/kubernetes requires: its go.mod pins them
# at v0.0.0 and points them at ./staging, which a dependent module cannot see, so each one is
# replaced by its published v0.<minor>.<patch>. The list is read from that go.mod so it follows
# the release (1.36 added e.g. k8s.io/streaming); unrequired ones (sample-cli-plugin, which
# the proxy does not serve) are left out.
staging_replaces() {
    local gomod staging_version="v0.${K8S_VERSION#v1.}"
    gomod="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    awk -v ver="${staging_version}" '
        $2 == "v0.0.0" && $1 ~ /^k8s\.io\// { required[$1] = 1 }
        $2 == "=>" && $3 ~ /^\.\/staging\// && ($1 in required) {
            printf "\t%s => %s %s\n", $1, $1, ver
        }' "${gomod}"
}

KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)

build_kube() {
    local dir="${SRC_DIR}/kubernetes" tmp
    mkdir -p "${dir}"
    {
        printf 'module muralist.dev/hack/kubernetes-wrapper\n\ngo 1.26.0\n\n'
        printf 'require k8s.io/kubernetes %s\n\nreplace (\n' "${K8S_VERSION}"
        staging_replaces
        printf ')\n'
    } >"${dir}/go.mod"
    tmp="$(mktemp -d "${CACHE_DIR}/tmp.XXXXXX")"
    log "building ${KUBE_BINARIES[*]} ${K8S_VERSION}"
    # One invocation for all of them so they share one module graph and the build cache.
    (cd "${dir}" && go_build -ldflags "$(kube_ldflags)" -o "${tmp}/" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kubectl \
        k8s.io/kubernetes/cmd/kubelet)
    install_built "${tmp}" "${K8S_VERSION}" "${KUBE_BINARIES[@]}"
    rm -rf "${tmp}"
}

# The release a Prometheus module tag stands for: v0.316.0 -> 3.16.0.
prometheus_release() {
    local minor="${PROMETHEUS_VERSION#v0.}"
    minor="${minor%%.*}"
    echo "$((minor / 100)).$((minor % 100)).${PROMETHEUS_VERSION##*.}"
}

# dashboard-check is built from this repository's hack/dashboard-check (its go.mod pins the SDK):
# its stamp is a digest of that source, so an edit or a bump rebuilds it.
dashboard_check_stamp() {
    cat "${HACK_DIR}/dashboard-check/"{go.mod,go.sum,main.go} | sha256sum | cut -c1-16
}

build_dashboard_check() {
    local tmp stamp
    stamp="$(dashboard_check_stamp)"
    tmp="$(mktemp -d "${CACHE_DIR}/tmp.XXXXXX")"
    log "building dashboard-check ${stamp}"
    (cd "${HACK_DIR}/dashboard-check" && go_build -ldflags "-s -w" -o "${tmp}/dashboard-check" .)
    install_built "${tmp}" "${stamp}" dashboard-check
    rm -rf "${tmp}"
}

# Kueue's go.mod has no replace directives: `go install` builds its manager. The CRDs come from
# the same module version, found in the module cache (downloaded first: its `Dir` is where they are), and
# are installed before the binary so a stamped binary always has its CRDs next to it.
build_kueue() {
    local dir crds
    dir="$(go mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    crds="$(mktemp -d "${CACHE_DIR}/tmp.XXXXXX")"
    cp "${dir}/config/components/crd/bases/"*.yaml "${crds}/"
    chmod -R u+w,go+rX "${crds}"
    rm -rf "${BIN_DIR}/kueue-crds"
    mv "${crds}" "${BIN_DIR}/kueue-crds"
    go_install kueue sigs.k8s.io/kueue/cmd/kueue "${KUEUE_VERSION}" \
        "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}"
}

main() {
    lock_cache
    is_current etcd "${ETCD_VERSION}" || build_etcd
    local name todo=0
    for name in "${KUBE_BINARIES[@]}"; do
        is_current "${name}" "${K8S_VERSION}" || todo=1
    done
    ((todo == 0)) || build_kube
    is_current kwok "${KWOK_VERSION}" ||
        go_install kwok sigs.k8s.io/kwok/cmd/kwok "${KWOK_VERSION}" \
            "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
    is_current kwokctl "${KWOK_VERSION}" ||
        go_install kwokctl sigs.k8s.io/kwok/cmd/kwokctl "${KWOK_VERSION}" \
            "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
    is_current helm "${HELM_VERSION}" ||
        go_install helm helm.sh/helm/v3/cmd/helm "${HELM_VERSION}" \
            "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
    is_current coredns "${COREDNS_VERSION}" ||
        go_install coredns github.com/coredns/coredns "${COREDNS_VERSION}" "-s -w"
    # Prometheus' Go module tags are v0.3MM.P for release 3.MM.P; its go.mod has no replace
    # directives, so a plain `go install` builds promtool.
    is_current promtool "${PROMETHEUS_VERSION}" ||
        go_install promtool github.com/prometheus/prometheus/cmd/promtool "${PROMETHEUS_VERSION}" \
            "-s -w -X github.com/prometheus/common/version.Version=$(prometheus_release)"
    # The CRDs directory is part of what a current kueue means (a cache from before it was added).
    { is_current kueue "${KUEUE_VERSION}" && [[ -d "${BIN_DIR}/kueue-crds" ]]; } || build_kueue
    is_current dashboard-check "$(dashboard_check_stamp)" || build_dashboard_check
    echo "${BIN_DIR}"
}

main "$@"
