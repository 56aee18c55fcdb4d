"""Fixtures for the kind chaos suite (`make e2e`).

Every test here is marked ``e2e`` and skipped, with the reason, unless Docker answers
``docker info`` and ``kind``, ``kubectl`` and ``helm`` are on PATH. The cluster fixtures live
in test_chaos.py (pytest's importlib mode cannot import helpers from a conftest).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _missing() -> str | None:
    for tool in ("docker", "kind", "kubectl", "helm"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (the kind suite needs docker, kind, kubectl and helm)"
    try:
        proc = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "docker info timed out: no usable Docker engine"
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"docker info failed, no Docker engine: {first}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing()
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
