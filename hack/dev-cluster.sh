#!/usr/bin/env bash
# A local Kubernetes control plane for a person at a terminal: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok with two fake GPU nodes (kwok-gpu-0/1,
# 8 nvidia.com/gpu each). The same control plane the cluster tests use; pods on it follow the
# fate annotations documented in hack/kwok-stages.yaml.
#
# Usage:
#   hack/dev-cluster.sh up      # build binaries if needed (long the first time), start, wait
#   eval "$(hack/dev-cluster.sh env)"
#   kubectl get nodes
#   hack/dev-cluster.sh down    # stop every process; logs stay in the state dir
#
# State (kubeconfig, certificates, etcd data, logs, pids):
#   ${MURALIST_DEV_CLUSTER_DIR:-$HOME/.cache/muralist/dev-cluster}
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR="${MURALIST_DEV_CLUSTER_DIR:-$HOME/.cache/muralist/dev-cluster}"
PYTHON="${PYTHON:-python3}"

usage() {
    echo "usage: $0 up|down|env" >&2
    exit 2
}

[[ $# -eq 1 ]] || usage
case "$1" in
up)
    bin_dir="$("${HACK_DIR}/cluster-binaries.sh" | tail -n 1)"
    mkdir -p "${STATE_DIR}"
    "${PYTHON}" "${HACK_DIR}/controlplane.py" up --state-dir "${STATE_DIR}" --bin-dir "${bin_dir}" >/dev/null
    echo "ready; to use it: eval \"\$($0 env)\"" >&2
    ;;
down)
    "${PYTHON}" "${HACK_DIR}/controlplane.py" down --state-dir "${STATE_DIR}"
    ;;
env)
    "${PYTHON}" "${HACK_DIR}/controlplane.py" env --state-dir "${STATE_DIR}"
    ;;
*)
    usage
    ;;
esac
