#!/usr/bin/env bash
# A local Kubernetes cluster for a person at a terminal, from upstream components built here.
#
#   up             etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok with two
#                  fake GPU nodes (kwok-gpu-0/1, 8 nvidia.com/gpu each): the control plane the
#                  cluster tests use; pods follow the fate annotations in hack/kwok-stages.yaml.
#   up --real-node the same control plane without fake nodes, plus one real node (root only):
#                  containerd, runc and the CNI plugins from Debian's packages, a local pause
#                  image, CoreDNS and kubelet (hack/real-node.py). Pods really run.
#   load IMAGE...  real node: import images from the local Docker engine (nothing is pulled).
#   env            print the exports that point kubectl at it.
#   down           stop every process; remove the node's bridge, mounts and iptables rules.
#
# Usage:
#   hack/dev-cluster.sh up [--real-node]   # builds the binaries if needed (long the first time)
#   eval "$(hack/dev-cluster.sh env)"
#   kubectl get nodes
#   hack/dev-cluster.sh down               # logs stay in the state dir
#
# State (kubeconfig, certificates, etcd data, node work dir, logs, pids):
#   ${MURALIST_DEV_CLUSTER_DIR:-$HOME/.cache/muralist/dev-cluster}
# The real node keeps its image store in ${MURALIST_CONTAINERD_ROOT:-$HOME/.cache/muralist/containerd}.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR="${MURALIST_DEV_CLUSTER_DIR:-$HOME/.cache/muralist/dev-cluster}"
PYTHON="${PYTHON:-python3}"
# Debian packages of the real node, each with a command or file that shows it is installed.
NODE_PACKAGES=(containerd:containerd runc:runc containernetworking-plugins:/usr/lib/cni/bridge
    iptables:iptables iproute2:ip gcc:gcc libc6-dev:/usr/lib/x86_64-linux-gnu/libc.a)

usage() {
    echo "usage: $0 up [--real-node] | load IMAGE... | env | down" >&2
    exit 2
}

node_packages() {
    local entry missing=()
    for entry in "${NODE_PACKAGES[@]}"; do
        [[ -e "${entry#*:}" ]] || command -v "${entry#*:}" >/dev/null || missing+=("${entry%%:*}")
    done
    if ((${#missing[@]})); then
        echo "installing ${missing[*]}" >&2
        apt_get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
            { apt_get update >/dev/null && apt_get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
    fi
}

# One apt at a time: the test tiers install their packages beside this (tests/apt.py, the same
# lock); another apt on the machine makes apt-get wait for dpkg's lock instead of failing.
apt_get() {
    DEBIAN_FRONTEND=noninteractive flock "${TMPDIR:-/tmp}/muralist-apt.lock" \
        apt-get -o DPkg::Lock::Timeout=600 "$@"
}

[[ $# -ge 1 ]] || usage
command="$1"
shift
case "${command}" in
up)
    real_node=()
    case "${1:-}" in
    "") ;;
    --real-node)
        [[ ${EUID} -eq 0 ]] || { echo "a real node needs root (containerd, netns, iptables)" >&2; exit 1; }
        real_node=(--real-node)
        ;;
    *) usage ;;
    esac
    bin_dir="$("${HACK_DIR}/cluster-binaries.sh" | tail -n 1)"
    mkdir -p "${STATE_DIR}"
    ((${#real_node[@]} == 0)) || node_packages
    "${PYTHON}" "${HACK_DIR}/controlplane.py" up --state-dir "${STATE_DIR}" --bin-dir "${bin_dir}" \
        "${real_node[@]}" >/dev/null
    if ((${#real_node[@]})); then
        "${PYTHON}" "${HACK_DIR}/real-node.py" up --state-dir "${STATE_DIR}" || {
            "${PYTHON}" "${HACK_DIR}/controlplane.py" down --state-dir "${STATE_DIR}"
            exit 1
        }
        echo "images: $0 load IMAGE... (from the local Docker engine)" >&2
    fi
    echo "ready; to use it: eval \"\$($0 env)\"" >&2
    ;;
load)
    [[ $# -ge 1 ]] || usage
    "${PYTHON}" "${HACK_DIR}/real-node.py" load --state-dir "${STATE_DIR}" "$@"
    ;;
down)
    if [[ -d "${STATE_DIR}/node" ]]; then
        "${PYTHON}" "${HACK_DIR}/real-node.py" down --state-dir "${STATE_DIR}"
    fi
    "${PYTHON}" "${HACK_DIR}/controlplane.py" down --state-dir "${STATE_DIR}"
    ;;
env)
    "${PYTHON}" "${HACK_DIR}/controlplane.py" env --state-dir "${STATE_DIR}"
    ;;
*)
    usage
    ;;
esac
