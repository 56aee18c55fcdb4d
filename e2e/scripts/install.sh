#!/usr/bin/env bash
# Install (or upgrade) the chart with the locally built operator image and a 1-node ZooKeeper,
# then wait for the operator and ZooKeeper to be ready.
#   e2e/scripts/install.sh [NAMESPACE] [TAG]
set -euo pipefail
cd "$(dirname "$0")/../.."
ns="${1:-understudy-system}"
tag="${2:-e2e}"
helm upgrade --install understudy charts/understudy \
  --namespace "$ns" --create-namespace \
  --set image.repository=understudy/operator --set image.tag="$tag" \
  --set image.pullPolicy=Never \
  --set operator.replicas=2 \
  --set zookeeper.replicas=1 \
  --set operator.logLevel=debug \
  --wait --timeout 5m
kubectl -n "$ns" rollout status statefulset/understudy-zookeeper --timeout=180s
kubectl -n "$ns" rollout status deployment/understudy-operator --timeout=180s
