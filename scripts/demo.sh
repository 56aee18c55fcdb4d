#!/usr/bin/env bash
# `make demo`: the embedded default. Placeholder until the drill lands (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/understudy --help
