"""Structural lint of the two Dockerfiles (no Docker engine here to build them): pinned bases,
non-root final user, a HEALTHCHECK, exec-form entrypoint, ports that match what the builders and
the chart use, and COPY sources that exist in the repository (the build context is its root)."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import yaml

from understudy_operator.k8s.zkconfig import BROKER_PORT, HTTP_PORT, REPLICATION_PORT

ROOT = pathlib.Path(__file__).resolve().parents[1]
VALUES = yaml.safe_load((ROOT / "charts" / "understudy" / "values.yaml").read_text())
CASES = {
    "broker_image/Dockerfile": {BROKER_PORT, HTTP_PORT, REPLICATION_PORT},
    "operator/Dockerfile": {VALUES["operator"]["metricsPort"], VALUES["operator"]["healthPort"]},
}


def instructions(path: pathlib.Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        result.append((word.upper(), rest.strip()))
    return result


@pytest.mark.parametrize(("name", "ports"), CASES.items())
def test_dockerfile(name: str, ports: set[int]) -> None:
    steps = instructions(ROOT / name)
    args = {rest.split("=")[0]: rest.split("=", 1)[1] for word, rest in steps if word == "ARG" and "=" in rest}
    froms = [rest for word, rest in steps if word == "FROM"]
    assert len(froms) >= 2, "multi-stage: build wheels, then a slim runtime"
    for base in froms:
        image = base.split()[0]
        for key, value in args.items():
            image = image.replace("${" + key + "}", value)
        assert ":" in image, base
        assert not image.endswith(":latest"), base

    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM"):]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the runtime stage must switch to a non-root user"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), "numeric USER so runAsNonRoot can verify it"
    assert int(uid) != 0
    assert any(word == "HEALTHCHECK" for word, _ in final)

    entry = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert entry
    assert json.loads(entry[-1]) == ["understudy"]

    exposed = {int(p.split("/")[0]) for word, rest in final if word == "EXPOSE" for p in rest.split()}
    assert exposed == ports

    for word, rest in steps:
        assert word != "ADD", "use COPY (ADD fetches URLs and unpacks archives implicitly)"
        if word == "COPY" and "--from" not in rest:
            *sources, _dest = rest.split()
            for src in sources:
                assert (ROOT / src).exists(), f"{name}: COPY {src} does not exist"
