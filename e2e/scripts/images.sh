#!/usr/bin/env bash
# Build the broker and operator images from the repository root and load them into kind.
#   e2e/scripts/images.sh [CLUSTER] [TAG]
set -euo pipefail
cd "$(dirname "$0")/../.."
name="${1:-${KIND_CLUSTER:-understudy-e2e}}"
tag="${2:-e2e}"
docker build -f broker_image/Dockerfile -t "understudy/broker:$tag" .
docker build -f operator/Dockerfile -t "understudy/operator:$tag" .
kind load docker-image --name "$name" "understudy/broker:$tag" "understudy/operator:$tag"
