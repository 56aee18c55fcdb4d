#!/usr/bin/env bash
# Installs what `make test`, `make demo` and `make bench` need on a fresh Debian machine:
# the Debian packages (ZooKeeper, Prometheus, NATS, a Java runtime, iproute2 and iptables
# for the partition tests) and the project venv.
# Idempotent and quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(zookeeper prometheus nats-server iproute2 iptables chromium)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.understudy-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing the project and its dev extras into .venv"
  # pip warns about optional local mirrors configured on some machines; keep real errors.
  .venv/bin/pip install -q --upgrade pip 2> >(grep -v "is ignored: it is neither" >&2)
  .venv/bin/pip install -q -e '.[dev]' 2> >(grep -v "is ignored: it is neither" >&2)
  touch "$stamp"
fi
# Bytecode for the project's own sources (the editable install leaves them uncompiled, and
# with PYTHONDONTWRITEBYTECODE set every broker start compiled ~50 modules again: 140 ms
# of CPU per restart, taken from the healthy brokers on a laptop's shared cores). Only
# changed files are recompiled; a stale cache is ignored by Python, never wrong.
.venv/bin/python -m compileall -q broker_image/src operator/src harness/src spark_jobs/src >/dev/null
