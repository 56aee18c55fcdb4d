"""BrokerGroup status computation: conditions per scenario, lastTransitionTime kept while a
condition's status holds, and the result valid against the CRD's status schema."""

from __future__ import annotations

import functools
import pathlib
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema
import yaml

from understudy_broker.model import GroupState, Mode, Permission
from understudy_operator.k8s.status import (
    CONDITION_TYPES,
    BrokerObservation,
    FailoverTimes,
    compute_status,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
T0 = datetime(2026, 11, 20, 12, 0, 0, tzinfo=UTC)
FULL, READ, NONE = Permission.FULL, Permission.READ, Permission.NONE


def broker(ordinal: int, effective: Permission | None, *, live: bool = True, ready: bool = True,
           lag: int | None = None) -> BrokerObservation:
    return BrokerObservation(
        name=f"g-{ordinal}",
        ordinal=ordinal,
        configured=FULL,
        effective=effective,
        live=live,
        ready=ready,
        replication_lag_bytes=lag,
    )


def conds(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def status_of(state: GroupState | None, brokers: list[BrokerObservation], **kw: Any) -> dict[str, Any]:
    return compute_status(generation=3, state=state, brokers=brokers, previous=None, now=T0, **kw)


@functools.cache
def status_validator() -> jsonschema.Draft202012Validator:
    crd = yaml.safe_load((ROOT / "crds" / "brokergroup.yaml").read_text())
    node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]

    def convert(n: Any) -> Any:
        if isinstance(n, list):
            return [convert(x) for x in n]
        if not isinstance(n, dict):
            return n
        out = {k: convert(v) for k, v in n.items() if not k.startswith("x-kubernetes-")}
        if n.get("nullable"):
            out["type"] = [out["type"], "null"]
        if n.get("type") == "object" and "properties" in n:
            out["additionalProperties"] = False
        return out

    return jsonschema.Draft202012Validator(convert(node), format_checker=jsonschema.FormatChecker())


def test_healthy_group() -> None:
    s = status_of(GroupState(Mode.NORMAL, 1), [broker(0, FULL, lag=None), broker(1, NONE, lag=0)])
    assert conds(s) == {
        "Ready": ("True", "Ready"),
        "ReadAvailable": ("True", "MasterReading"),
        "Writable": ("True", "MasterWritable"),
        "FailoverInProgress": ("False", "Normal"),
        "BackSyncComplete": ("True", "Normal"),
        "Degraded": ("False", "AllBrokersReady"),
    }
    assert s["observedGeneration"] == 3
    assert (s["mode"], s["epoch"], s["master"], s["acting"], s["readable"]) == ("NORMAL", 1, "g-0", None, True)
    assert s["readyBrokers"] == "2/2"
    assert s["brokers"][1] == {
        "name": "g-1", "ordinal": 1, "role": "slave", "configuredPermission": "FULL",
        "effectivePermission": "NONE", "live": True, "ready": True, "replicationLagBytes": 0,
    }
    assert [c["type"] for c in s["conditions"]] == list(CONDITION_TYPES)


def test_slave_consume() -> None:
    state = GroupState(Mode.SLAVE_CONSUME, 4, acting="g-1", reason="master pod terminated")
    s = status_of(state, [broker(0, None, live=False, ready=False), broker(1, READ)])
    c = conds(s)
    assert c["Ready"] == ("False", "FailoverInProgress")
    assert c["ReadAvailable"] == ("True", "ActingSlaveReading")
    assert c["Writable"] == ("False", "MasterNotWritable")
    assert c["FailoverInProgress"] == ("True", "SlaveConsume")
    assert c["BackSyncComplete"] == ("False", "WaitingForMaster")
    assert c["Degraded"] == ("True", "BrokersNotReady")
    assert s["acting"] == "g-1"
    assert s["mode"] == "SLAVE_CONSUME"
    msg = next(x["message"] for x in s["conditions"] if x["type"] == "FailoverInProgress")
    assert msg == "mode SLAVE_CONSUME at epoch 4 (master pod terminated)"


def test_recovering() -> None:
    state = GroupState(Mode.RECOVERING, 5, acting="g-1")
    c = conds(status_of(state, [broker(0, NONE), broker(1, NONE)]))
    assert c["BackSyncComplete"] == ("False", "BackSyncRunning")
    assert c["ReadAvailable"] == ("False", "NoReader")
    assert c["FailoverInProgress"] == ("True", "Recovering")


def test_all_brokers_down_is_degraded() -> None:
    state = GroupState(Mode.SLAVE_CONSUME, 6, acting="g-1")
    brokers = [broker(0, None, live=False, ready=False), broker(1, None, live=False, ready=False)]
    s = status_of(state, brokers)
    assert conds(s)["Degraded"] == ("True", "AllBrokersDown")
    assert conds(s)["ReadAvailable"] == ("False", "Unknown")
    assert s["readable"] is False


def test_two_readers_is_reported_as_a_violation() -> None:
    c = conds(status_of(GroupState(Mode.NORMAL, 2), [broker(0, FULL), broker(1, READ)]))
    assert c["Degraded"] == ("True", "OneReaderViolation")


def test_invalid_spec_and_missing_state() -> None:
    c = conds(status_of(None, [], spec_error="spec.slaves: -1 is out of range [0, 15]"))
    assert c["Ready"] == ("False", "InvalidSpec")
    c2 = conds(status_of(None, [broker(0, FULL)]))
    assert c2["Ready"] == ("False", "NoGroupState")
    assert c2["FailoverInProgress"] == ("False", "Unknown")


def test_last_transition_time_is_kept_while_status_holds() -> None:
    healthy = [broker(0, FULL), broker(1, NONE)]
    first = compute_status(generation=1, state=GroupState(Mode.NORMAL, 1), brokers=healthy, previous=None, now=T0)
    later = T0 + timedelta(minutes=5)
    # Same facts, new epoch message: nothing flips, so every timestamp stays.
    second = compute_status(generation=2, state=GroupState(Mode.NORMAL, 3), brokers=healthy, previous=first, now=later)
    assert [c["lastTransitionTime"] for c in second["conditions"]] == ["2026-11-20T12:00:00Z"] * 6
    # The master dies: the conditions that flip get the new time, the others keep theirs.
    third = compute_status(
        generation=2,
        state=GroupState(Mode.SLAVE_CONSUME, 4, acting="g-1"),
        brokers=[broker(0, None, live=False, ready=False), broker(1, READ)],
        previous=second,
        now=later,
    )
    times = {c["type"]: c["lastTransitionTime"] for c in third["conditions"]}
    assert times == {
        "Ready": "2026-11-20T12:05:00Z",
        "ReadAvailable": "2026-11-20T12:00:00Z",
        "Writable": "2026-11-20T12:05:00Z",
        "FailoverInProgress": "2026-11-20T12:05:00Z",
        "BackSyncComplete": "2026-11-20T12:05:00Z",
        "Degraded": "2026-11-20T12:05:00Z",
    }


def test_garbage_previous_conditions_are_ignored() -> None:
    s = compute_status(
        generation=1, state=GroupState(Mode.NORMAL, 1), brokers=[broker(0, FULL)],
        previous={"conditions": ["junk", {"type": "Ready"}]}, now=T0,
    )
    assert all(c["lastTransitionTime"] == "2026-11-20T12:00:00Z" for c in s["conditions"])


def test_last_failover_timestamps() -> None:
    times = FailoverTimes(master_down=T0, reads_restored=T0 + timedelta(seconds=2))
    s = status_of(GroupState(Mode.SLAVE_CONSUME, 2, acting="g-1"), [broker(1, READ)], last_failover=times)
    assert s["lastFailover"] == {
        "masterDown": "2026-11-20T12:00:00Z",
        "readsRestored": "2026-11-20T12:00:02Z",
        "masterBack": None,
        "normalAgain": None,
    }


def test_every_status_matches_the_crd_status_schema() -> None:
    cases = [
        status_of(GroupState(Mode.NORMAL, 1), [broker(0, FULL), broker(1, NONE, lag=12)]),
        status_of(GroupState(Mode.SLAVE_CONSUME, 4, acting="g-1"), [broker(0, None, live=False), broker(1, READ)],
                  last_failover=FailoverTimes(master_down=T0)),
        status_of(None, [], spec_error="bad"),
    ]
    for s in cases:
        status_validator().validate(s)
