"""Fixtures for the container suite (`make e2e-containers`, docs/containers.md).

The suite runs the built images (`make images`) with podman as root. Where that cannot
happen — not root, podman or runc missing, an image not built, or podman unable to run a
container — every test here is skipped with the reason. It is not part of `make test`
(pyproject's testpaths do not name this folder).
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from understudy_harness.containers import (
    BROKER_IMAGE,
    OPERATOR_IMAGE,
    ZOOKEEPER_IMAGE,
    Podman,
    why_not_here,
)

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if HERE in Path(str(item.fspath)).parents]
    if not ours:
        return
    reason = why_not_here([BROKER_IMAGE, OPERATOR_IMAGE, ZOOKEEPER_IMAGE])
    for item in ours:
        item.add_marker(pytest.mark.integration)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def podman() -> Iterator[Podman]:
    """A :class:`Podman` whose containers and networks are removed by ID afterwards,
    whatever the test did; the test fails if one could not be removed."""
    pm = Podman(f"us-{uuid.uuid4().hex[:6]}")
    try:
        yield pm
    finally:
        left = pm.close()
        assert not left, f"could not remove: {left}"


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A host folder for the containers' mounts (files owned by the images' uid)."""
    path = Path(tempfile.mkdtemp(prefix="understudy-containers-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
