"""Pure parts of the operator: the rollout and scaling planner, pod-liveness classification,
the status milestones, the client's apply comparison, and the CLI's flag handling."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from understudy_broker import metric_names
from understudy_broker.cli import cli
from understudy_broker.model import GroupState, Mode, Permission
from understudy_operator.cli.kube_operator import split_zk
from understudy_operator.controller.observe import ProcessState
from understudy_operator.handlers.metrics import OperatorMetrics
from understudy_operator.handlers.reconcile import with_operator_defaults
from understudy_operator.handlers.status import advance_failover_times
from understudy_operator.k8s.kube import KubeError, is_subset, matches_labels, resource_of
from understudy_operator.k8s.podliveness import PodLiveness, classify_pod
from understudy_operator.k8s.rollout import (
    BrokerFacts,
    PodFacts,
    RolloutFacts,
    handoff_target,
    plan_rollout,
    plan_scale,
)

# --------------------------------------------------------------------------- rollout planner

NEW, OLD = "g-new", "g-old"


def facts(*, revisions: tuple[str, ...] = (OLD, OLD, OLD), offsets: tuple[int, ...] = (100,) * 3,
          mode: Mode = Mode.NORMAL, epoch: int = 5, ready: tuple[bool, ...] | None = None,
          live: tuple[bool, ...] | None = None, applied: tuple[int, ...] | None = None,
          terminating: tuple[bool, ...] | None = None,
          configured: tuple[Permission, ...] | None = None,
          update_revision: str | None = NEW, max_lag: int = 10) -> RolloutFacts:
    n = len(revisions)
    ready = ready or (True,) * n
    live = live or (True,) * n
    applied = applied or (epoch,) * n
    terminating = terminating or (False,) * n
    configured = configured or (Permission.FULL,) + (Permission.READ,) * (n - 1)
    pods = [PodFacts(name=f"g-{o}", ordinal=o, revision=revisions[o], ready=ready[o],
                     terminating=terminating[o], uid=f"uid-{o}") for o in range(n)]
    brokers = {f"g-{o}": BrokerFacts(name=f"g-{o}", ordinal=o, configured=configured[o],
                                     live=live[o], epoch_applied=applied[o],
                                     max_offset=offsets[o], has_status=True)
               for o in range(n)}
    return RolloutFacts(replicas=n, update_revision=update_revision, pods=pods, brokers=brokers,
                        state=GroupState(mode=mode, epoch=epoch, acting=None),
                        max_lag_bytes=max_lag)


def test_slaves_restart_first_highest_ordinal_first() -> None:
    step = plan_rollout(facts())
    assert (step.kind, step.pod, step.uid) == ("restart-slave", "g-2", "uid-2")
    assert step.outdated == ("g-0", "g-1", "g-2")
    step = plan_rollout(facts(revisions=(OLD, OLD, NEW)))
    assert (step.kind, step.pod) == ("restart-slave", "g-1")


def test_the_master_goes_last_through_a_handoff_to_the_most_caught_up_slave() -> None:
    step = plan_rollout(facts(revisions=(OLD, NEW, NEW), offsets=(100, 95, 98)))
    assert (step.kind, step.pod, step.acting) == ("handoff", "g-0", "g-2")
    assert "planned handoff" in step.reason
    tie = plan_rollout(facts(revisions=(OLD, NEW, NEW), offsets=(100, 100, 100)))
    assert tie.acting == "g-1"


def test_a_master_without_a_slave_that_may_read_restarts_plainly() -> None:
    step = plan_rollout(facts(revisions=(OLD, NEW), offsets=(100, 100),
                              configured=(Permission.FULL, Permission.NONE)))
    assert (step.kind, step.pod, step.acting) == ("restart-master", "g-0", None)
    assert "reads pause" in step.reason


def test_nothing_moves_until_the_previous_pod_is_back_and_in_sync() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"ready": (True, True, False)}, "g-2 is not ready"),
        ({"terminating": (False, True, False)}, "g-1 is terminating"),
        ({"live": (True, False, True)}, "g-1 is not live"),
        ({"applied": (5, 5, 4)}, "g-2 has not applied epoch 5"),
        ({"offsets": (100, 100, 80)}, "g-2 lags the master by 20 bytes"),
        ({"mode": Mode.SLAVE_CONSUME}, "group is SLAVE_CONSUME"),
        ({"update_revision": None}, "no update revision"),
    ]
    for kwargs, words in cases:
        step = plan_rollout(facts(revisions=(OLD, NEW, NEW), **kwargs))
        assert step.kind == "wait", kwargs
        assert words in step.reason, (kwargs, step.reason)


def test_a_missing_pod_blocks_and_a_finished_rollout_is_done() -> None:
    f = facts(revisions=(OLD, OLD, OLD))
    gone = RolloutFacts(replicas=3, update_revision=NEW, pods=list(f.pods)[:2],
                        brokers=f.brokers, state=f.state)
    step = plan_rollout(gone)
    assert step.kind == "wait"
    assert "ordinal 2 does not exist" in step.reason
    assert plan_rollout(facts(revisions=(NEW, NEW, NEW))).kind == "done"


def test_handoff_target_skips_lagging_dead_and_unreadable_slaves() -> None:
    f = facts(offsets=(100, 50, 100), live=(True, True, False))
    assert handoff_target(f) is None
    f = facts(offsets=(100, 95, 100), configured=(Permission.FULL, Permission.READ,
                                                  Permission.NONE))
    target = handoff_target(f)
    assert target is not None
    assert target.name == "g-1"


def test_handoff_target_respects_the_recorded_in_sync_set() -> None:
    base = facts(revisions=(OLD, NEW, NEW), offsets=(100, 100, 100))
    only_2 = RolloutFacts(replicas=3, update_revision=NEW, pods=base.pods, brokers=base.brokers,
                          state=base.state, max_lag_bytes=10, in_sync=frozenset({"g-2"}))
    step = plan_rollout(only_2)
    assert (step.kind, step.acting) == ("handoff", "g-2")
    nobody = RolloutFacts(replicas=3, update_revision=NEW, pods=base.pods, brokers=base.brokers,
                          state=base.state, max_lag_bytes=10, in_sync=frozenset())
    assert plan_rollout(nobody).kind == "restart-master"


def test_scale_down_never_removes_the_acting_slave() -> None:
    names = {o: f"g-{o}" for o in range(4)}
    acting_2 = GroupState(mode=Mode.SLAVE_CONSUME, epoch=3, acting="g-2")
    blocked = plan_scale(current=3, desired=2, state=acting_2, broker_name_of=names)
    assert not blocked.allowed
    assert "g-2 acts for reads" in blocked.reason
    assert plan_scale(current=4, desired=3, state=acting_2, broker_name_of=names).allowed
    assert plan_scale(current=3, desired=2, state=GroupState(Mode.NORMAL, 3),
                      broker_name_of=names).allowed
    assert plan_scale(current=2, desired=3, state=acting_2, broker_name_of=names).allowed
    assert plan_scale(current=None, desired=3, state=None).allowed


# --------------------------------------------------------------------------- pod liveness


def pod(*, state: dict[str, Any] | None = None, ready: bool = True, restarts: int = 0,
        deleting: bool = False, phase: str = "Running", uid: str = "u1",
        last: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "g-0", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-21T00:00:00Z"
    status: dict[str, Any] = {"phase": phase,
                              "conditions": [{"type": "Ready", "status": str(ready)}]}
    if state is not None:
        cs: dict[str, Any] = {"name": "broker", "state": state, "restartCount": restarts}
        if last is not None:
            cs["lastState"] = last
        status["containerStatuses"] = [cs]
    return {"metadata": meta, "status": status}


RUNNING = {"running": {"startedAt": "x"}}


@pytest.mark.parametrize(("body", "deleted", "expected", "words"), [
    (pod(state=RUNNING), False, ProcessState.RUNNING, "running and ready"),
    (pod(state=RUNNING, ready=False), False, ProcessState.UNKNOWN, "not ready"),
    (pod(state=RUNNING, deleting=True), False, ProcessState.STOPPED, "terminating"),
    (pod(state={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}), False,
     ProcessState.EXITED, "exit code 137, OOMKilled"),
    (pod(state={"waiting": {"reason": "CrashLoopBackOff"}}, restarts=3), False,
     ProcessState.EXITED, "CrashLoopBackOff"),
    (pod(state={"waiting": {"reason": "ContainerCreating"}}), False, ProcessState.UNKNOWN,
     "not started yet"),
    (pod(state={"waiting": {}}, last={"terminated": {"exitCode": 1}}), False,
     ProcessState.EXITED, "after an exit"),
    (pod(state=None, phase="Pending"), False, ProcessState.UNKNOWN, "no status"),
    (pod(state=RUNNING, phase="Failed"), False, ProcessState.EXITED, "phase Failed"),
    (pod(state=RUNNING), True, ProcessState.EXITED, "pod deleted"),
])
def test_classify_pod(body: dict[str, Any], deleted: bool, expected: ProcessState,
                      words: str) -> None:
    verdict = classify_pod(body, deleted=deleted)
    assert verdict.state is expected
    assert words in verdict.reason


def test_classify_pod_without_a_pod_is_unknown() -> None:
    assert classify_pod(None).state is ProcessState.UNKNOWN


@pytest.mark.parametrize("body", [
    {"metadata": [], "status": "Running"},
    {"status": {"containerStatuses": "broker", "conditions": {"Ready": True}}},
    {"status": {"containerStatuses": [{"name": "broker", "state": ["running"],
                                       "restartCount": "many"}]}},
    {"status": {"containerStatuses": [{"name": "broker", "state": {"waiting": None},
                                       "restartCount": None, "lastState": 3}]}},
    {"status": {"containerStatuses": [{"name": "broker",
                                       "state": {"terminated": "yes"}}]}},
])
def test_a_malformed_pod_is_classified_without_raising(body: dict[str, Any]) -> None:
    verdict = classify_pod(body)
    assert verdict.state in (ProcessState.UNKNOWN, ProcessState.EXITED)
    live = PodLiveness()
    assert live.observe(body).state is verdict.state


def test_pod_liveness_wakes_listeners_once_per_certain_death() -> None:
    live = PodLiveness()
    woken: list[str] = []
    live.subscribe(woken.append)
    live.observe(pod(state=RUNNING))
    assert live.process_state("g-0") is ProcessState.RUNNING
    live.observe(pod(state=RUNNING, ready=False))  # ambiguous: no wake-up
    assert woken == []
    live.observe(pod(state={"terminated": {"exitCode": 1}}))
    live.observe(pod(state={"terminated": {"exitCode": 1}}))
    assert woken == ["g-0"]
    assert live.process_state("g-0") is ProcessState.EXITED
    live.observe(pod(state=RUNNING, uid="u2"))  # the replacement pod
    assert live.process_state("g-0") is ProcessState.RUNNING
    live.observe(pod(state=RUNNING, uid="u1"), deleted=True)  # late DELETED of the old pod
    assert live.process_state("g-0") is ProcessState.RUNNING
    assert woken == ["g-0"]
    assert live.process_state("unknown-broker") is ProcessState.UNKNOWN


def test_a_pod_marked_for_deletion_never_reads_as_healthy_until_it_is_replaced() -> None:
    live = PodLiveness()
    live.observe(pod(state=RUNNING))
    live.mark_terminating("g-0", "u1")
    assert live.process_state("g-0") is ProcessState.STOPPED
    live.observe(pod(state=RUNNING))  # a stale event from before the deletion
    assert live.process_state("g-0") is ProcessState.STOPPED
    live.observe(pod(state=RUNNING), deleted=True)
    assert live.process_state("g-0") is ProcessState.EXITED
    live.observe(pod(state=RUNNING, uid="u2"))
    assert live.process_state("g-0") is ProcessState.RUNNING


# --------------------------------------------------------------------------- small pure parts


def test_is_subset_follows_merge_patch_semantics() -> None:
    current = {"a": 1, "b": {"c": [1, 2], "d": "x"}, "e": None}
    assert is_subset({"b": {"c": [1, 2]}}, current)
    assert not is_subset({"b": {"c": [1]}}, current)  # lists compare whole
    assert is_subset({"gone": None, "e": None}, current)  # None means absent
    assert not is_subset({"a": None}, current)
    assert not is_subset({"f": 1}, current)


def test_matches_labels_and_unknown_kind() -> None:
    obj = {"metadata": {"labels": {"a": "1", "b": "2"}}}
    assert matches_labels(obj, {"a": "1"})
    assert not matches_labels(obj, {"a": "2"})
    assert resource_of({"kind": "StatefulSet"}).plural == "statefulsets"
    with pytest.raises(KubeError, match="no resource for kind 'Gizmo'"):
        resource_of({"kind": "Gizmo"})


def test_failover_milestones_follow_the_mode_changes() -> None:
    def st(mode: Mode, epoch: int, since: float) -> GroupState:
        return GroupState(mode=mode, epoch=epoch, since=since)

    t = advance_failover_times(None, st(Mode.NORMAL, 1, 0), st(Mode.FENCING, 2, 100))
    assert t is not None
    assert t.master_down == datetime.fromtimestamp(100, UTC)
    t = advance_failover_times(t, st(Mode.FENCING, 2, 100), st(Mode.SLAVE_CONSUME, 3, 101))
    t = advance_failover_times(t, st(Mode.SLAVE_CONSUME, 3, 101), st(Mode.RECOVERING, 4, 150))
    t = advance_failover_times(t, st(Mode.RECOVERING, 4, 150), st(Mode.NORMAL, 5, 152))
    assert t is not None
    assert [x.timestamp() if x else None for x in
            (t.master_down, t.reads_restored, t.master_back, t.normal_again)] == [
        100, 101, 150, 152]
    same = advance_failover_times(t, st(Mode.NORMAL, 5, 152), st(Mode.NORMAL, 5, 152))
    assert same is t


def test_operator_defaults_fill_only_a_missing_chroot() -> None:
    assert with_operator_defaults({}, chroot="/u")["zookeeper"] == {"chroot": "/u"}
    spec = {"zookeeper": {"connect": "zk:2181", "chroot": "/mine"}}
    assert with_operator_defaults(spec, chroot="/u") == spec
    assert with_operator_defaults({"zookeeper": {"connect": "zk:2181"}}, chroot="/u")[
        "zookeeper"] == {"connect": "zk:2181", "chroot": "/u"}
    assert with_operator_defaults({}, chroot=None) == {}


def test_operator_metrics_register_the_pinned_names() -> None:
    m = OperatorMetrics()
    with m.timed("reconcile"):
        pass
    with pytest.raises(RuntimeError), m.timed("status"):
        raise RuntimeError("boom")
    m.decision("g", "mode-fencing")
    r = m.registry
    assert r.get_sample_value(f"{metric_names.OPERATOR_RECONCILE_DURATION_SECONDS}_count",
                              {"handler": "reconcile"}) == 1
    assert r.get_sample_value(metric_names.OPERATOR_ERRORS_TOTAL,
                              {"handler": "status", "kind": "unexpected"}) == 1
    assert r.get_sample_value(metric_names.OPERATOR_DECISIONS_TOTAL,
                              {"group": "g", "decision": "mode-fencing"}) == 1
    assert r.get_sample_value(metric_names.OPERATOR_LEADING_GROUPS) == 0


# --------------------------------------------------------------------------- CLI


def test_split_zk() -> None:
    assert split_zk("zk-0.zk:2181,zk-1.zk:2181/understudy") == (
        "zk-0.zk:2181,zk-1.zk:2181", "/understudy")
    assert split_zk("127.0.0.1:2181") == ("127.0.0.1:2181", None)
    for bad in ("zk", "zk:2181/", "zk:2181/a//b", "/understudy"):
        with pytest.raises(ValueError, match=r"expected|chroot"):
            split_zk(bad)
    # The flag's chroot is the default of every spec naming none: held to a manifest's rule
    # (the CRD's pattern) as well as ZooKeeper's, so a spec does not fail on it later.
    with pytest.raises(ValueError, match=r"'/a b' must be an absolute path .* default of every spec"):
        split_zk("zk:2181/a b")
    with pytest.raises(ValueError, match="port 70000 is outside 1-65535"):
        split_zk("zk:2181,zk:70000")
    assert split_zk(" zk-0:2181 , zk-1:2181/u") == ("zk-0:2181,zk-1:2181", "/u")


def test_operator_help_is_true_and_bad_flags_are_usage_errors() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["operator", "--help"])
    assert result.exit_code == 0
    for flag in ("--zk", "--all-namespaces", "--namespace", "--metrics-port", "--health-port",
                 "--log-level"):
        assert flag in result.output
    both = runner.invoke(cli, ["operator", "-A", "-n", "x"])
    assert both.exit_code == 2
    assert "exactly one of --all-namespaces or --namespace" in both.output
    neither = runner.invoke(cli, ["operator"])
    assert neither.exit_code == 2
    bad_zk = runner.invoke(cli, ["operator", "-A", "--zk", "nohost"])
    assert bad_zk.exit_code == 2
    assert "HOST:PORT" in bad_zk.output
    bad_level = runner.invoke(cli, ["operator", "-A", "--log-level", "loud"])
    assert bad_level.exit_code == 2


@pytest.mark.skipif(Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists(),
                    reason="running in a pod: the service account provides credentials")
def test_operator_without_credentials_says_what_to_do(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Any) -> None:
    monkeypatch.setenv("KUBECONFIG", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["operator", "-n", "x", "--metrics-port", "0",
                                      "--health-port", "0"])
    assert result.exit_code == 1
    assert "no Kubernetes credentials" in result.output


def test_controller_group_series_follow_changes_and_come_back_after_forget() -> None:
    """The group gauges are set only when their value changes (every check of every group
    reports), yet always show the last state and degraded flag, including after the
    series were removed (leadership lost) and the group is led again."""
    from prometheus_client import generate_latest

    from understudy_operator.controller.driver import ControllerMetrics

    m = ControllerMetrics()

    def shown() -> dict[str, float]:
        text = generate_latest(m.registry).decode()
        out = {}
        for name in ("understudy_group_mode", "understudy_group_epoch", "understudy_group_degraded"):
            found = re.search(rf'^{name}\{{group="g1"\}} (\S+)$', text, re.M)
            if found is not None:
                out[name] = float(found[1])
        return out

    normal = GroupState(Mode.NORMAL, epoch=1)
    m.set_state("g1", normal)
    m.set_degraded("g1", False)
    m.set_state("g1", normal)
    assert shown() == {"understudy_group_mode": 0.0, "understudy_group_epoch": 1.0,
                       "understudy_group_degraded": 0.0}
    m.set_state("g1", GroupState(Mode.FENCING, epoch=2))
    m.set_degraded("g1", True)
    assert shown() == {"understudy_group_mode": 1.0, "understudy_group_epoch": 2.0,
                       "understudy_group_degraded": 1.0}
    m.forget("g1")
    assert shown() == {}
    m.set_state("g1", GroupState(Mode.FENCING, epoch=2, since=5.0))  # the same values as before
    m.set_degraded("g1", True)
    assert shown() == {"understudy_group_mode": 1.0, "understudy_group_epoch": 2.0,
                       "understudy_group_degraded": 1.0}

    def entered(mode: str) -> float | None:
        text = generate_latest(m.registry).decode()
        found = re.search(rf'^understudy_group_mode_entered_timestamp_seconds\{{group="g1",mode="{mode}"\}} (\S+)$',
                          text, re.M)
        return None if found is None else float(found[1])

    # A mode found (not written here) is dated by its state's since, once per mode.
    assert entered("FENCING") == 5.0
    m.set_state("g1", GroupState(Mode.FENCING, epoch=2, since=6.0))
    assert entered("FENCING") == 5.0
    # A transition this controller wrote is dated by its write, even into the same mode.
    m.set_state("g1", GroupState(Mode.FENCING, epoch=3, since=7.0), entered_at=8.0)
    assert entered("FENCING") == 8.0
    m.set_state("g1", GroupState(Mode.SLAVE_CONSUME, epoch=4, since=9.0))
    assert entered("SLAVE_CONSUME") == 9.0
