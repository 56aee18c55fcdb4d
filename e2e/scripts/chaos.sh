#!/usr/bin/env bash
# Inject one fault into a broker pod of a kind cluster.
#   e2e/scripts/chaos.sh delete-pod NAMESPACE POD     kubectl delete (graceful, then recreated)
#   e2e/scripts/chaos.sh kill-9     NAMESPACE POD     SIGKILL the broker process from the node
#   e2e/scripts/chaos.sh partition  NAMESPACE POD     drop all non-loopback traffic of the pod
#   e2e/scripts/chaos.sh heal       NAMESPACE POD     undo partition
# kill -9 and partition act from the kind node (a container) on the pod's process and network
# namespace: PID 1 inside the pod ignores SIGKILL sent from its own PID namespace, and pods
# hold no NET_ADMIN capability.
set -euo pipefail
action="${1:?usage: chaos.sh delete-pod|kill-9|partition|heal NAMESPACE POD}"
ns="${2:?namespace}"
pod="${3:?pod}"

node_pid() {
  local node cid
  node="$(kubectl -n "$ns" get pod "$pod" -o jsonpath='{.spec.nodeName}')"
  cid="$(kubectl -n "$ns" get pod "$pod" -o jsonpath='{.status.containerStatuses[?(@.name=="broker")].containerID}')"
  cid="${cid#*://}"
  [ -n "$cid" ] || { echo "chaos.sh: $pod has no running broker container" >&2; exit 1; }
  NODE="$node"
  PID="$(docker exec "$node" crictl inspect --output go-template --template '{{.info.pid}}' "$cid")"
}

case "$action" in
  delete-pod)
    kubectl -n "$ns" delete pod "$pod" --wait=false
    ;;
  kill-9)
    node_pid
    docker exec "$NODE" kill -9 "$PID"
    echo "killed pid $PID of $pod on $NODE" >&2
    ;;
  partition)
    node_pid
    docker exec "$NODE" nsenter -t "$PID" -n iptables -I INPUT ! -i lo -j DROP
    docker exec "$NODE" nsenter -t "$PID" -n iptables -I OUTPUT ! -o lo -j DROP
    echo "partitioned $pod (pid $PID on $NODE)" >&2
    ;;
  heal)
    node_pid
    docker exec "$NODE" nsenter -t "$PID" -n iptables -D INPUT ! -i lo -j DROP || true
    docker exec "$NODE" nsenter -t "$PID" -n iptables -D OUTPUT ! -o lo -j DROP || true
    echo "healed $pod" >&2
    ;;
  *)
    echo "chaos.sh: unknown action '$action'" >&2
    exit 2
    ;;
esac
