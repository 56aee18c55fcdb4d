#!/usr/bin/env bash
# Build the broker and operator images from the repository root and load them into kind.
#   e2e/scripts/images.sh [CLUSTER] [TAG]
# The same Dockerfiles and build script as `make images` and the container suite
# (scripts/images.sh), with Docker: the Dockerfiles' default base (python:3.11-slim-bookworm)
# unless BASE is set.
set -euo pipefail
cd "$(dirname "$0")/../.."
name="${1:-${KIND_CLUSTER:-understudy-e2e}}"
tag="${2:-e2e}"
ENGINE=docker TAG="$tag" bash scripts/images.sh build
kind load docker-image --name "$name" "understudy/broker:$tag" "understudy/operator:$tag"
