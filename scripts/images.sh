#!/usr/bin/env bash
# Build the broker and operator images (`make images`), and the container suite's ZooKeeper.
#
#   scripts/images.sh [all]      tools, the local base, broker + operator images, their sizes
#   scripts/images.sh tools      install podman, runc, debootstrap ... when missing (Debian)
#   scripts/images.sh base       the local base image (debootstrap bookworm + python3 3.11)
#   scripts/images.sh build      broker + operator images from their Dockerfiles, sizes
#   scripts/images.sh zookeeper  the container suite's ZooKeeper image (Debian's zookeeper)
#   scripts/images.sh sizes      print each image's size
#
# ENGINE=podman (default) or docker. With podman no registry is assumed: the Dockerfiles'
# BASE build argument gets the local base (localhost/understudy-base:bookworm, made with
# debootstrap through the machine's Debian package source); pip in the build stage reaches
# PyPI through the host's network and CA bundle. With docker the Dockerfiles' default base
# (python:3.11-slim-bookworm, pulled) is used unless BASE is set. TAG (default dev) names
# the images understudy/broker:TAG and understudy/operator:TAG.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE="${ENGINE:-podman}"
TAG="${TAG:-dev}"
LOCAL_BASE="localhost/understudy-base:bookworm"
ZK_IMAGE="localhost/understudy-zookeeper:bookworm"
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/scripts/containers.conf}"

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

say() { echo "images: $*" >&2; }

tools() {
  [ "$ENGINE" = podman ] || { command -v "$ENGINE" >/dev/null || { say "$ENGINE is not installed"; exit 1; }; return; }
  local missing=() p
  for p in podman runc debootstrap uidmap slirp4netns fuse-overlayfs; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

base() {
  [ "$ENGINE" = podman ] || return 0
  if $SUDO podman image exists "$LOCAL_BASE"; then
    say "$LOCAL_BASE exists"
    return
  fi
  local root
  root="$(mktemp -d /tmp/understudy-base.XXXXXX)"
  trap '$SUDO rm -rf "$root"' RETURN
  say "debootstrap bookworm (minbase + python3, python3-venv, ca-certificates) into $root"
  $SUDO debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" http://deb.debian.org/debian >/dev/null
  # Smaller: no package caches, lists, docs, manuals or translations.
  $SUDO rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
    "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
    "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/var/log/*.log
  $SUDO tar -C "$root" -c . | $SUDO podman import --change 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
  say "imported $LOCAL_BASE"
}

build_one() {  # build_one DOCKERFILE IMAGE
  local args=(build -f "$1" -t "$2")
  if [ "$ENGINE" = podman ]; then
    # docker format: OCI images drop HEALTHCHECK. Host network and CA bundle: pip -> PyPI.
    args+=(--format docker --network host -v /etc/ssl/certs:/etc/ssl/certs:ro
           --build-arg "BASE=${BASE:-$LOCAL_BASE}" --build-arg "CA_BUNDLE=$CA_BUNDLE")
  elif [ -n "${BASE:-}" ]; then
    args+=(--build-arg "BASE=$BASE")
  fi
  say "$ENGINE ${args[*]} ."
  $SUDO "$ENGINE" "${args[@]}" .
}

build() {
  build_one broker_image/Dockerfile "understudy/broker:$TAG"
  build_one operator/Dockerfile "understudy/operator:$TAG"
  sizes
}

zookeeper() {
  [ "$ENGINE" = podman ] || { say "the ZooKeeper image is for the podman suite"; exit 1; }
  if $SUDO podman image exists "$ZK_IMAGE"; then
    say "$ZK_IMAGE exists"
    return
  fi
  $SUDO podman build --format docker --network host --build-arg "BASE=$LOCAL_BASE" \
    -f e2e_containers/zookeeper.Containerfile -t "$ZK_IMAGE" e2e_containers >&2
}

sizes() {
  local image bytes
  for image in "understudy/broker:$TAG" "understudy/operator:$TAG"; do
    bytes="$($SUDO "$ENGINE" image inspect -f '{{.Size}}' "$image")"
    awk -v i="$image" -v b="$bytes" 'BEGIN { printf "image %-28s %6.1f MB\n", i, b / 1e6 }'
  done
}

case "${1:-all}" in
  tools) tools ;;
  base) tools; base ;;
  build) tools; base; build ;;
  zookeeper) tools; base; zookeeper ;;
  sizes) sizes ;;
  all) tools; base; build ;;
  *) say "unknown action '$1' (all|tools|base|build|zookeeper|sizes)"; exit 2 ;;
esac
