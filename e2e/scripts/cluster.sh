#!/usr/bin/env bash
# Create or delete the kind cluster the e2e suite runs in.
#   e2e/scripts/cluster.sh create [NAME]   (idempotent; 1 control plane + 2 workers)
#   e2e/scripts/cluster.sh delete [NAME]
set -euo pipefail
action="${1:?usage: cluster.sh create|delete [name]}"
name="${2:-${KIND_CLUSTER:-understudy-e2e}}"

case "$action" in
  create)
    if kind get clusters 2>/dev/null | grep -qx "$name"; then
      echo "kind cluster $name already exists" >&2
    else
      kind create cluster --name "$name" --wait 120s --config - <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
KIND
    fi
    kubectl config use-context "kind-$name" >/dev/null
    ;;
  delete)
    kind delete cluster --name "$name"
    ;;
  *)
    echo "cluster.sh: unknown action '$action' (create|delete)" >&2
    exit 2
    ;;
esac
