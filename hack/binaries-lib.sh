# Helpers of hack/cluster-binaries.sh (sourced; set LOG_PREFIX first).
# Cache layout: ${MURALIST_K8S_CACHE:-$HOME/.cache/muralist/k8s}/<k8s-version>/{bin,src}, each
# binary stamped with the version it was built at.

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"

CACHE_DIR="${MURALIST_K8S_CACHE:-$HOME/.cache/muralist/k8s}/${K8S_VERSION}"
BIN_DIR="${CACHE_DIR}/bin"
SRC_DIR="${CACHE_DIR}/src"

log() { echo "[${LOG_PREFIX}] $*" >&2; }

# A binary counts as built only when its stamp names the version pinned now, so bumping
# versions.env rebuilds exactly what changed.
is_current() { # name version
    [[ -x "${BIN_DIR}/$1" && "$(cat "${BIN_DIR}/.$1.version" 2>/dev/null)" == "$2" ]]
}

# Move freshly built binaries into BIN_DIR and stamp them; done last so an interrupted build
# never leaves something that looks complete.
install_built() { # tmpdir version names...
    local tmp="$1" version="$2" name
    shift 2
    for name in "$@"; do
        mv -f "${tmp}/${name}" "${BIN_DIR}/${name}"
        echo "${version}" >"${BIN_DIR}/.${name}.version"
        log "built ${name} ${version} ($(du -h "${BIN_DIR}/${name}" | cut -f1))"
    done
}

go_build() { # build flags and packages, run inside a wrapper module
    CGO_ENABLED=0 go build -mod=mod -trimpath "$@"
}

# Truthful `--version` for Kubernetes binaries: the variables Kubernetes' own build stamps.
kube_ldflags() {
    local minor="${K8S_VERSION#v1.}" pkg ldflags="-s -w"
    minor="${minor%%.*}"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1"
        ldflags+=" -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"
        ldflags+=" -X ${pkg}.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    echo "${ldflags}"
}

# Modules that are plain `go install`able (no replace directives in their go.mod).
go_install() { # name module/cmd version ldflags
    local tmp
    tmp="$(mktemp -d "${CACHE_DIR}/tmp.XXXXXX")"
    log "building $1 $3"
    (cd "${tmp}" && CGO_ENABLED=0 GOBIN="${tmp}" go install -trimpath -ldflags "$4" "$2@$3")
    install_built "${tmp}" "$3" "$1"
    rm -rf "${tmp}"
}

# Two builds at once (e.g. a test run and a dev cluster) would race on BIN_DIR.
lock_cache() {
    mkdir -p "${BIN_DIR}"
    exec 9>"${CACHE_DIR}/.lock"
    flock 9
}
