"""The BrokerGroup CRD: valid for Kubernetes 1.29-1.33, samples that apply as they are, bad
samples rejected, structural defaults equal to spec.py's, and the CEL rules agreeing with
spec.py's cross-field checks (evaluated with cel-python, the same CEL language the API server
runs; the Kubernetes CEL extension libraries are not used by these rules)."""

from __future__ import annotations

import functools
import pathlib
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from understudy_harness import crdschema
from understudy_harness.crdschema import apply_defaults
from understudy_operator.k8s.spec import SpecError, parse_spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
CRD_PATH = ROOT / "crds" / "brokergroup.yaml"
SAMPLES = sorted(p for p in (ROOT / "crds" / "samples").glob("*.yaml")
                 if not p.name.startswith(("topic-", "user-")))  # tests/test_k8s_topic.py, test_operator_security.py
K8S_VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33"]


@functools.cache
def crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return doc


def schema() -> dict[str, Any]:
    version = crd()["spec"]["versions"][0]
    result: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return result


def validator() -> jsonschema.Draft202012Validator:
    return crdschema.validator(schema())


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_crd_is_a_valid_customresourcedefinition(version: str) -> None:
    kubernetes_validate.validate(crd(), version, strict=True)


def test_chart_ships_an_identical_copy_of_the_crd() -> None:
    copy_path = ROOT / "charts" / "understudy" / "crds" / "brokergroup.yaml"
    assert copy_path.read_bytes() == CRD_PATH.read_bytes(), (
        "charts/understudy/crds/brokergroup.yaml differs from crds/brokergroup.yaml: "
        "cp crds/brokergroup.yaml charts/understudy/crds/"
    )


def test_crd_names_and_printer_columns() -> None:
    spec = crd()["spec"]
    assert spec["names"]["shortNames"] == ["bg"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    status_props = schema()["properties"]["status"]["properties"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    for name in ("Mode", "Epoch", "Master", "Acting", "Readable", "Age"):
        assert name in columns
    for path in columns.values():
        head, _, field = path.lstrip(".").partition(".")
        if head == "status":
            assert field in status_props, path


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_validate_against_the_schema(path: pathlib.Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "understudy.io/v1alpha1"
    assert doc["kind"] == "BrokerGroup"
    validator().validate(doc)


def test_there_are_samples() -> None:
    assert len(SAMPLES) >= 3


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        ({"permission": "ALL"}, "permission"),
        ({"slaves": -1}, "slaves"),
        ({"replication": {"mode": "semi"}}, "mode"),
        ({"failover": {"checkIntervalMs": 1}}, "checkIntervalMs"),
        ({"zookeeper": {"chroot": "no-slash"}}, "chroot"),
        ({"brokers": [{"ordinal": 1}]}, "permission"),
        ({"replicas": 3}, "replicas"),
    ],
)
def test_schema_rejects_bad_fields(patch: dict[str, Any], where: str) -> None:
    doc = {
        "apiVersion": "understudy.io/v1alpha1",
        "kind": "BrokerGroup",
        "metadata": {"name": "bad"},
        "spec": {"image": "i", "slaves": 1, **patch},
    }
    errors = list(validator().iter_errors(doc))
    assert errors
    assert any(where in (str(e.path) + e.message) for e in errors), [e.message for e in errors]


def test_schema_defaults_match_spec_py_defaults() -> None:
    spec_schema = schema()["properties"]["spec"]
    defaulted = apply_defaults(spec_schema, {"image": "i"})
    explicit = parse_spec(defaulted, default_zk_connect="zk:2181")
    implicit = parse_spec({"image": "i"}, default_zk_connect="zk:2181")
    assert explicit == implicit
    # And the defaults are really there (the comparison above is not vacuous).
    assert defaulted["replication"] == {"mode": "sync", "minInSyncReplicas": 1,
                                        "autoDegrade": False, "maxLagBytes": 256 << 20}
    assert defaulted["failover"]["checkIntervalMs"] == 250


def cel_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = schema()["properties"]["spec"]["x-kubernetes-validations"]
    return rules


def test_cel_rules_are_present_with_messages() -> None:
    rules = cel_rules()
    assert len(rules) == 4
    for rule in rules:
        assert rule["rule"].strip()
        assert rule["message"].strip()
    root_rules = schema()["x-kubernetes-validations"]
    assert "self.metadata.name" in root_rules[0]["rule"]


@functools.cache
def cel_programs() -> list[tuple[str, Any]]:
    celpy = pytest.importorskip("celpy", reason="cel-python (dev extra) evaluates the CRD rules")
    env = celpy.Environment()
    return [(r["message"], env.program(env.compile(r["rule"]))) for r in cel_rules()]


def cel_verdict(spec: dict[str, Any]) -> list[str]:
    """Messages of the CEL rules that reject ``spec`` (after structural defaulting)."""
    import celpy

    defaulted = celpy.json_to_cel(apply_defaults(schema()["properties"]["spec"], spec))
    return [msg for msg, program in cel_programs() if not program.evaluate({"self": defaulted})]


def test_cel_rejects_what_spec_py_rejects_on_known_cases() -> None:
    assert cel_verdict({"image": "i", "slaves": 2}) == []
    assert cel_verdict({"image": "i", "slaves": 0}) == [
        "sync replication needs at least one slave (spec.slaves >= 1)",
        "spec.replication.minInSyncReplicas must not exceed spec.slaves",
    ]
    assert cel_verdict(
        {"image": "i", "slaves": 1, "replication": {"minInSyncReplicas": 2}}
    ) == ["spec.replication.minInSyncReplicas must not exceed spec.slaves"]
    assert cel_verdict(
        {"image": "i", "slaves": 1, "brokers": [{"ordinal": 2, "permission": "READ"}]}
    ) == ["every spec.brokers[].ordinal must name an existing broker (0..spec.slaves)"]
    copies = ("spec.replication.inSyncReplicas counts the master: it must be between "
              "minInSyncReplicas + 1 and spec.slaves + 1")
    assert cel_verdict({"image": "i", "slaves": 2, "replication": {"inSyncReplicas": 3}}) == []
    assert cel_verdict({"image": "i", "slaves": 2, "replication": {"inSyncReplicas": 4}}) == [
        copies]
    assert cel_verdict({"image": "i", "slaves": 2, "replication": {
        "inSyncReplicas": 2, "minInSyncReplicas": 2}}) == [copies]
    assert cel_verdict({"image": "i", "slaves": 2, "replication": {
        "mode": "async", "inSyncReplicas": 9}}) == []


@settings(max_examples=150, deadline=None)
@given(
    slaves=st.integers(0, 4),
    mode=st.sampled_from(["sync", "async"]),
    min_isr=st.integers(0, 5),
    copies=st.one_of(st.none(), st.integers(1, 6)),
    ordinals=st.lists(st.integers(0, 6), max_size=3, unique=True),
)
def test_cel_and_spec_py_agree(slaves: int, mode: str, min_isr: int, copies: int | None,
                               ordinals: list[int]) -> None:
    spec = {
        "image": "i",
        "slaves": slaves,
        "replication": {"mode": mode, "minInSyncReplicas": min_isr,
                        **({} if copies is None else {"inSyncReplicas": copies})},
        "brokers": [{"ordinal": o, "permission": "READ"} for o in ordinals],
    }
    cel_ok = cel_verdict(spec) == []
    try:
        parse_spec(spec, default_zk_connect="zk:2181")
        py_ok = True
    except SpecError:
        py_ok = False
    assert cel_ok == py_ok, spec
