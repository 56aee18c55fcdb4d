"""The BrokerTopic CRD and its pure sync rules: a valid CRD for Kubernetes 1.29-1.33, samples
that apply as they are, bad specs refused by the schema and by parse_topic_spec alike, CEL
transition rules that keep a topic's name, ordering and ZooKeeper, and the plans the
operator writes into /topics/<t> (the CLI's rules: unknown groups, backlog, ordered)."""

from __future__ import annotations

import functools
import pathlib
from typing import Any

import kubernetes_validate
import pytest
import yaml

from understudy_broker.topology import TopicPlanError, plan_create
from understudy_broker.zklayout import TopicDoc
from understudy_harness import crdschema
from understudy_operator.k8s.spec import SpecError
from understudy_operator.k8s.topicspec import (
    DeletionPolicy,
    check_update,
    parse_topic_spec,
    placement_status,
    plan_delete,
    plan_sync,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
CRD_PATH = ROOT / "crds" / "brokertopic.yaml"
SAMPLES = sorted((ROOT / "crds" / "samples").glob("topic-*.yaml"))
ZK = "zk:2181"


@functools.cache
def crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return doc


def schema() -> dict[str, Any]:
    result: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return result


def spec_schema() -> dict[str, Any]:
    result: dict[str, Any] = schema()["properties"]["spec"]
    return result


@pytest.mark.parametrize("version", ["1.29", "1.30", "1.31", "1.32", "1.33"])
def test_crd_is_a_valid_customresourcedefinition(version: str) -> None:
    kubernetes_validate.validate(crd(), version, strict=True)


def test_names_printer_columns_and_status_fields() -> None:
    spec = crd()["spec"]
    assert spec["group"] == "understudy.io"  # the BrokerGroup's API group
    assert spec["names"]["kind"] == "BrokerTopic"
    assert spec["names"]["shortNames"] == ["bt"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    status_props = schema()["properties"]["status"]["properties"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert {"Topic", "Queues", "Groups", "Ready", "Age"} <= set(columns)
    for path in columns.values():
        head, _, field = path.lstrip(".").partition(".")
        if head == "status":
            assert field.split("[")[0] in status_props, path
    # Every key the handler writes is declared (the API server prunes undeclared ones).
    written = placement_status(TopicDoc("t", ("g1", None, "g2"), True)) | {
        "topic": "t", "zookeeper": "zk:2181/u", "conditions": [], "observedGeneration": 1}
    assert set(written) <= set(status_props)


def test_there_are_samples() -> None:
    assert len(SAMPLES) >= 2


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_validate_and_parse(path: pathlib.Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("understudy.io/v1alpha1", "BrokerTopic")
    crdschema.validator(schema()).validate(doc)
    parsed = parse_topic_spec(crdschema.apply_defaults(spec_schema(), doc["spec"]),
                              name=doc["metadata"]["name"], default_zk_connect=ZK)
    assert parsed.groups


BAD = [
    ({"groups": []}, "groups"),
    ({"groups": ["g1", "g1"]}, "groups"),
    ({"groups": ["g1"], "queuesPerGroup": 0}, "queuesPerGroup"),
    ({"groups": ["g1"], "queuesPerGroup": 5000}, "queuesPerGroup"),
    ({"groups": ["g1"], "deletionPolicy": "Purge"}, "deletionPolicy"),
    ({"groups": ["g1"], "topicName": "no spaces"}, "topicName"),
    ({"groups": ["g1"], "zookeeper": {"chroot": "relative"}}, "chroot"),
    ({"groups": ["g1"], "replicas": 3}, "replicas"),
    ({}, "groups"),
]


@pytest.mark.parametrize(("spec", "where"), BAD, ids=[w for _, w in BAD])
def test_bad_specs_are_refused_by_the_schema_and_by_the_parser(spec: dict[str, Any],
                                                                where: str) -> None:
    doc = {"apiVersion": "understudy.io/v1alpha1", "kind": "BrokerTopic",
           "metadata": {"name": "bad"}, "spec": spec}
    errors = list(crdschema.validator(schema()).iter_errors(doc))
    # The schema cannot see duplicates in a list-type "set" (the API server can): the
    # parser must, and it names the field either way.
    if where != "groups" or spec.get("groups") != ["g1", "g1"]:
        assert any(where in (str(e.path) + e.message) for e in errors), [e.message for e in errors]
    with pytest.raises(SpecError) as info:
        parse_topic_spec(spec, name="bad", default_zk_connect=ZK)
    assert any(where in problem for problem in info.value.problems), info.value.problems


def test_schema_defaults_match_the_parser_defaults() -> None:
    defaulted = crdschema.apply_defaults(spec_schema(), {"groups": ["g1"]})
    # queuesPerGroup has no schema default: the parser's is 4, or 1 for an ordered topic.
    assert "queuesPerGroup" not in defaulted
    assert defaulted["deletionPolicy"] == "Retain"
    assert (parse_topic_spec(defaulted, name="t", default_zk_connect=ZK)
            == parse_topic_spec({"groups": ["g1"]}, name="t", default_zk_connect=ZK))
    assert parse_topic_spec(defaulted, name="t", default_zk_connect=ZK).queues_per_group == 4
    ordered = parse_topic_spec({"groups": ["g1", "g2"], "ordered": True}, name="t",
                               default_zk_connect=ZK)
    assert ordered.queues_per_group == 1


@pytest.mark.parametrize(("spec", "refused"), [
    ({"groups": ["g1", "g2"], "ordered": True}, False),
    ({"groups": ["g1", "g2"], "ordered": True, "queuesPerGroup": 1}, False),
    ({"groups": ["g1", "g2"], "ordered": True, "queuesPerGroup": 4}, True),
    ({"groups": ["g1", "g2"], "queuesPerGroup": 4}, False),
])
def test_an_ordered_topic_has_one_queue_per_group_in_cel_and_in_the_parser(
        spec: dict[str, Any], refused: bool) -> None:
    rules = spec_schema()["x-kubernetes-validations"]
    cel = crdschema.cel_failures(rules, spec_schema(), spec)
    assert cel == (["an ordered topic has one queue per group (omit queuesPerGroup, or set 1)"]
                   if refused else [])
    if refused:
        with pytest.raises(SpecError, match="one queue per group"):
            parse_topic_spec(spec, name="t", default_zk_connect=ZK)
    else:
        parse_topic_spec(spec, name="t", default_zk_connect=ZK)


def test_topic_name_defaults_to_the_resource_name_and_zookeeper_to_the_operators() -> None:
    spec = parse_topic_spec({"groups": ["g1", "g2"]}, name="orders", default_zk_connect=ZK,
                            default_chroot="/prod")
    assert spec.topic == "orders"
    assert spec.zookeeper.url == "zk:2181/prod"
    assert spec.deletion_policy is DeletionPolicy.RETAIN
    named = parse_topic_spec({"groups": ["g1"], "topicName": "Audit_Log",
                              "zookeeper": {"connect": "a:1", "chroot": "/x"}},
                             name="audit-log", default_zk_connect=ZK, default_chroot="/prod")
    assert (named.topic, named.zookeeper.url) == ("Audit_Log", "a:1/x")


def test_cel_transition_rules_keep_name_ordering_and_zookeeper() -> None:
    rules = spec_schema()["x-kubernetes-validations"]
    node = spec_schema()
    base = {"groups": ["g1"]}

    def update(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
        return crdschema.cel_failures(rules, node, new, old)

    assert crdschema.cel_failures(rules, node, base) == []  # create: no transition rules
    assert update(base, {"groups": ["g1", "g2"], "queuesPerGroup": 8}) == []
    assert update(base, {**base, "topicName": "other"}) == [
        "spec.topicName cannot change (create another BrokerTopic)"]
    assert update(base, {**base, "ordered": True}) == [
        "spec.ordered cannot change (create another BrokerTopic)"]
    assert update(base, {**base, "zookeeper": {"chroot": "/elsewhere"}}) == [
        "spec.zookeeper cannot change: the topic lives in the ZooKeeper it was created in"]


def test_the_parser_rechecks_the_transition_rules_against_what_was_applied() -> None:
    spec = parse_topic_spec({"groups": ["g1"], "topicName": "b"}, name="t", default_zk_connect=ZK)
    assert check_update({"topic": "b", "zookeeper": "zk:2181/understudy"}, spec) == []
    assert check_update({}, spec) == []  # nothing applied yet
    problems = check_update({"topic": "a", "zookeeper": "other:1/understudy"}, spec)
    assert [p.split(":")[0] for p in problems] == ["spec.topicName", "spec.zookeeper"]


# ----------------------------------------------------------------------------- sync plans


def topic_spec(**spec: Any) -> Any:
    return parse_topic_spec({"groups": ["g1", "g2"], "queuesPerGroup": 2, **spec},
                            name="orders", default_zk_connect=ZK)


KNOWN = ["g1", "g2", "g3"]


def test_an_absent_topic_is_created_interleaved_over_its_groups() -> None:
    plan = plan_sync(topic_spec(), None, known_groups=KNOWN)
    assert plan.doc is not None
    assert plan.removes == ()
    assert plan.doc.queues == ("g1", "g2", "g1", "g2")


def test_a_matching_topic_needs_no_write() -> None:
    current = plan_create("orders", ["g1", "g2"], 2, known_groups=KNOWN)
    assert plan_sync(topic_spec(), current, known_groups=KNOWN).doc is None


def test_adding_a_group_and_queues_keeps_every_existing_queue_where_it_is() -> None:
    current = plan_create("orders", ["g1", "g2"], 2, known_groups=KNOWN)
    plan = plan_sync(topic_spec(groups=["g1", "g2", "g3"], queuesPerGroup=3), current,
                     known_groups=KNOWN)
    assert plan.doc is not None
    assert plan.removes == ()
    assert plan.doc.queues[:4] == current.queues
    assert sorted(plan.doc.queues_of("g3"))
    assert len(plan.doc.queues_of("g3")) == 3
    assert all(len(plan.doc.queues_of(g)) == 3 for g in ("g1", "g2", "g3"))


def test_an_unknown_group_is_refused() -> None:
    with pytest.raises(TopicPlanError) as info:
        plan_sync(topic_spec(groups=["g1", "nope"]), None, known_groups=KNOWN)
    assert "nope" in str(info.value)


def test_removing_queues_asks_for_the_backlog_and_refuses_a_busy_queue() -> None:
    current = plan_create("orders", ["g1", "g2"], 2, known_groups=KNOWN)
    shrink = topic_spec(groups=["g1"])
    first = plan_sync(shrink, current, known_groups=KNOWN)
    assert first.doc is None
    assert first.removes == (1, 3)
    with pytest.raises(TopicPlanError) as info:
        plan_sync(shrink, current, known_groups=KNOWN, backlog={1: 0, 3: 7})
    assert info.value.code == "backlog"
    assert "3 (7 unconsumed)" in str(info.value)
    drained = plan_sync(shrink, current, known_groups=KNOWN, backlog={1: 0, 3: 0})
    assert drained.doc is not None
    assert drained.doc.queues == ("g1", None, "g1", None)  # queue ids are never reused


def test_a_change_of_ordering_is_refused_against_the_document() -> None:
    current = plan_create("orders", ["g1", "g2"], 1, known_groups=KNOWN, ordered=True)
    with pytest.raises(TopicPlanError) as info:
        plan_sync(topic_spec(), current, known_groups=KNOWN)
    assert info.value.code == "ordered-mismatch"


def test_deletion_follows_the_policy() -> None:
    current = plan_create("orders", ["g1", "g2"], 1, known_groups=KNOWN)
    assert plan_delete(topic_spec(), current, backlog=None) is False  # Retain
    assert plan_delete(topic_spec(deletionPolicy="Delete"), None, backlog=None) is False
    with pytest.raises(TopicPlanError):  # backlog unknown: held
        plan_delete(topic_spec(deletionPolicy="Delete"), current, backlog=None)
    with pytest.raises(TopicPlanError):
        plan_delete(topic_spec(deletionPolicy="Delete"), current, backlog={0: 0, 1: 2})
    assert plan_delete(topic_spec(deletionPolicy="Delete"), current, backlog={0: 0, 1: 0})
    assert plan_delete(topic_spec(deletionPolicy="ForceDelete"), current, backlog=None)
