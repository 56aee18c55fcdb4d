"""The pure failover state machine: one test per transition and per exception."""

from __future__ import annotations

from dataclasses import replace

import pytest

from understudy_broker.model import GroupState, Mode, Permission
from understudy_broker.zklayout import BrokerSpec, BrokerStatus, FailoverPolicy, GroupConfig
from understudy_operator.controller.machine import (
    ForceRefused,
    Memory,
    decide,
    plan_force,
)
from understudy_operator.controller.observe import BrokerView, Observation, ProcessState

R, S, X, U = ProcessState.RUNNING, ProcessState.STOPPED, ProcessState.EXITED, ProcessState.UNKNOWN


def cfg(slaves: int = 2, *, checks: int = 2, timeout: float = 10.0, enabled: bool = True,
        slave_perm: Permission = Permission.READ) -> GroupConfig:
    brokers = tuple(
        BrokerSpec(name=f"b{i}", ordinal=i, host="127.0.0.1", port=9000 + i,
                   replication_port=9100 + i, http_port=9200 + i,
                   permission=Permission.FULL if i == 0 else slave_perm)
        for i in range(slaves + 1)
    )
    return GroupConfig(group="g", brokers=brokers, failover=FailoverPolicy(
        enabled=enabled, check_interval_ms=250, detection_checks=checks,
        backsync_timeout_s=timeout)).validate()


def st(name: str, *, epoch: int, eff: Permission = Permission.NONE, link: bool = False,
       offset: int = 0, ready: bool = False, slave_links: tuple[str, ...] = (),
       backsync: int | None = None) -> BrokerStatus:
    return BrokerStatus(broker=name, effective=eff, epoch_applied=epoch, master_link=link,
                        max_offset=offset, ready=ready, slave_links=slave_links,
                        backsync_epoch=backsync)


def obs(now: float, *views: BrokerView) -> Observation:
    return Observation(now=now, wall=1000.0 + now, brokers={v.name: v for v in views})


def up(name: str, status: BrokerStatus | None = None, process: ProcessState = R) -> BrokerView:
    return BrokerView(name=name, zk_live=True, process=process, status=status)


def gone(name: str, process: ProcessState = X, status: BrokerStatus | None = None) -> BrokerView:
    return BrokerView(name=name, zk_live=False, process=process, status=status)


NORMAL1 = GroupState(Mode.NORMAL, 1)


def slaves_link_down(epoch: int, offsets: tuple[int, int] = (5, 5)) -> tuple[BrokerView, ...]:
    return (up("b1", st("b1", epoch=epoch, offset=offsets[0])),
            up("b2", st("b2", epoch=epoch, offset=offsets[1])))


# ----------------------------------------------------------------- NORMAL -> FENCING


def test_healthy_group_stays_normal() -> None:
    c = cfg()
    d = decide(c, NORMAL1, obs(0, up("b0", st("b0", epoch=1, eff=Permission.FULL)),
                               up("b1", st("b1", epoch=1, link=True)),
                               up("b2", st("b2", epoch=1, link=True))), Memory())
    assert d.target is None
    assert not d.degraded


def test_certain_master_death_fences_at_once_even_with_stale_link_status() -> None:
    c = cfg()
    # The slaves' last statuses still say "link up": published before the crash.
    d = decide(c, NORMAL1, obs(0, gone("b0", X), up("b1", st("b1", epoch=1, link=True)),
                               up("b2", st("b2", epoch=1, link=True))), Memory())
    assert d.target is not None
    assert (d.target.mode, d.target.epoch, d.target.acting) == (Mode.FENCING, 2, None)
    assert "process exited" in d.reason
    assert d.phases == (("detect", 0.0),)


def test_ambiguous_signal_needs_detection_checks() -> None:
    c = cfg(checks=3)  # window = 2 x 250 ms
    stopped = BrokerView("b0", zk_live=True, process=S)
    d1 = decide(c, NORMAL1, obs(10.0, stopped, *slaves_link_down(1)), Memory())
    assert d1.target is None
    assert d1.recheck_in == pytest.approx(0.5)
    d2 = decide(c, NORMAL1, obs(10.25, stopped, *slaves_link_down(1)), d1.memory)
    assert d2.target is None
    d3 = decide(c, NORMAL1, obs(10.5, stopped, *slaves_link_down(1)), d2.memory)
    assert d3.target is not None
    assert d3.target.mode is Mode.FENCING
    assert d3.phases == (("detect", pytest.approx(0.5)),)


def test_ambiguous_signal_must_be_consecutive() -> None:
    c = cfg(checks=2)
    stopped = BrokerView("b0", zk_live=True, process=S)
    d1 = decide(c, NORMAL1, obs(0.0, stopped, *slaves_link_down(1)), Memory())
    d2 = decide(c, NORMAL1, obs(0.2, up("b0"), *slaves_link_down(1)), d1.memory)
    d3 = decide(c, NORMAL1, obs(0.3, stopped, *slaves_link_down(1)), d2.memory)
    assert d3.target is None  # the run restarted at 0.3
    d4 = decide(c, NORMAL1, obs(0.55, stopped, *slaves_link_down(1)), d3.memory)
    assert d4.target is not None


def test_master_down_but_slaves_still_linked_does_not_fail_over() -> None:
    # Master lost its ZooKeeper session but still replicates to its slaves: no failover.
    c = cfg()
    views = (BrokerView("b0", zk_live=False, process=R), up("b1", st("b1", epoch=1, link=True)),
             up("b2", st("b2", epoch=1, link=True)))
    d = decide(c, NORMAL1, obs(0, *views), Memory())
    d = decide(c, NORMAL1, obs(5, *views), d.memory)
    assert d.target is None
    assert "no eligible slave" in d.reason
    assert not d.degraded


def test_write_only_slaves_are_not_eligible() -> None:
    c = cfg(slave_perm=Permission.NONE)
    d = decide(c, NORMAL1, obs(0, gone("b0"), *slaves_link_down(1)), Memory())
    assert d.target is None


def test_master_and_all_slaves_down_is_degraded_and_stays() -> None:
    c = cfg()
    d = decide(c, NORMAL1, obs(0, gone("b0"), gone("b1"), gone("b2", U)), Memory())
    assert d.target is None
    assert d.degraded
    assert "degraded" in d.reason


def test_failover_disabled_never_moves() -> None:
    c = cfg(enabled=False)
    d = decide(c, NORMAL1, obs(0, gone("b0"), *slaves_link_down(1)), Memory())
    assert d.target is None
    assert "disabled" in d.reason


# ----------------------------------------------------------------- FENCING -> SLAVE_CONSUME

FENCING2 = GroupState(Mode.FENCING, 2)


@pytest.mark.parametrize(
    ("master", "proof"),
    [
        (gone("b0", X), "process exited"),
        (gone("b0", S), "session is gone"),
        (up("b0", st("b0", epoch=2, eff=Permission.NONE), process=S), "acknowledged NONE"),
    ],
)
def test_fencing_moves_on_proof_and_picks_highest_offset(master: BrokerView, proof: str) -> None:
    c = cfg()
    d = decide(c, FENCING2, obs(0, master, *slaves_link_down(2, (7, 9))), Memory(epoch=2, entered_at=0))
    if d.target is None:
        # Ambiguous proofs: offsets must come from statuses published after the proof.
        assert "waiting for fresh offsets" in d.reason
        fresh = tuple(replace(v, status_version=v.status_version + 1)
                      for v in slaves_link_down(2, (7, 9)))
        d = decide(c, FENCING2, obs(0.1, master, *fresh), d.memory)
    assert d.target is not None
    assert (d.target.mode, d.target.epoch, d.target.acting) == (Mode.SLAVE_CONSUME, 3, "b2")
    assert proof in d.reason
    assert d.phases[0][0] == "fence"


def test_fencing_waits_for_proof() -> None:
    c = cfg()
    # Stopped with a live session and an ack from an older epoch: not proof.
    master = up("b0", st("b0", epoch=1, eff=Permission.FULL), process=S)
    d = decide(c, FENCING2, obs(0, master, *slaves_link_down(2)), Memory())
    assert d.target is None
    assert "waiting for proof" in d.reason
    # An ack at this epoch that still has READ is not proof either.
    master = up("b0", st("b0", epoch=2, eff=Permission.READ))
    assert decide(c, FENCING2, obs(0, master, *slaves_link_down(2)), Memory()).target is None


def test_stale_offsets_are_not_trusted_after_an_ambiguous_proof() -> None:
    c = cfg()
    master = gone("b0", S)  # session gone, process stopped: ambiguous, no certain death
    before = (up("b1", st("b1", epoch=2, offset=9)), up("b2", st("b2", epoch=2, offset=5)))
    d = decide(c, FENCING2, obs(0, master, *before), Memory())
    assert d.target is None
    # b1 has not republished; b2 has, and now shows the commits it received late.
    after = (before[0], replace(up("b2", st("b2", epoch=2, offset=12)), status_version=0))
    d2 = decide(c, FENCING2, obs(0.1, master, *after), d.memory)
    assert d2.target is None
    assert "waiting for fresh offsets from b1" in d2.reason
    # b1 never republishes: after a session timeout the fresh ones decide.
    d3 = decide(c, FENCING2, obs(2.5, master, *after), d2.memory)
    assert d3.target is not None
    assert d3.target.acting == "b2"


def test_after_certain_death_offsets_count_from_statuses_at_this_epoch() -> None:
    c = cfg()
    d = decide(c, FENCING2, obs(0, gone("b0"), up("b1", st("b1", epoch=1, offset=9)),
                                up("b2", st("b2", epoch=2, offset=5))), Memory())
    assert d.target is None
    d = decide(c, FENCING2, obs(0.05, gone("b0"), up("b1", st("b1", epoch=2, offset=9)),
                                up("b2", st("b2", epoch=2, offset=5))), d.memory)
    assert d.target is not None
    assert d.target.acting == "b1"


def test_acting_tie_goes_to_lowest_ordinal() -> None:
    c = cfg()
    d = decide(c, FENCING2, obs(0, gone("b0"), *slaves_link_down(2, (9, 9))), Memory())
    assert d.target is not None
    assert d.target.acting == "b1"


def test_fencing_master_back_and_no_slave_returns_to_normal() -> None:
    c = cfg()
    master = up("b0", st("b0", epoch=2, eff=Permission.NONE))
    views = (master, up("b1", st("b1", epoch=2, link=True)), up("b2", st("b2", epoch=2, link=True)))
    d = decide(c, FENCING2, obs(0, *views), Memory())
    assert d.target is not None
    assert (d.target.mode, d.target.epoch) == (Mode.NORMAL, 3)


def test_fencing_with_every_slave_gone_stays() -> None:
    c = cfg()
    d = decide(c, FENCING2, obs(0, gone("b0"), gone("b1"), gone("b2")), Memory())
    assert d.target is None
    assert d.degraded


# ----------------------------------------------------------------- SLAVE_CONSUME

SC3 = GroupState(Mode.SLAVE_CONSUME, 3, acting="b1")


def test_switch_phase_completes_when_acting_reports_read() -> None:
    c = cfg()
    mem = Memory(epoch=3, entered_at=1.0, switch_pending_since=1.0)
    views = (gone("b0"), up("b1", st("b1", epoch=3, eff=Permission.READ)), up("b2", st("b2", epoch=3)))
    d = decide(c, SC3, obs(1.2, *views), mem)
    assert d.target is None
    assert d.phases == (("switch", pytest.approx(0.2)),)
    assert decide(c, SC3, obs(1.3, *views), d.memory).phases == ()


def test_master_ready_starts_recovering() -> None:
    c = cfg()
    master = up("b0", st("b0", epoch=3, ready=True, slave_links=("b1",)))
    d = decide(c, SC3, obs(0, master, up("b1", st("b1", epoch=3, eff=Permission.READ)), gone("b2")),
               Memory())
    assert d.target is not None
    assert (d.target.mode, d.target.epoch, d.target.acting) == (Mode.RECOVERING, 4, "b1")


@pytest.mark.parametrize(
    "master_status",
    [
        st("b0", epoch=3, ready=False, slave_links=("b1",)),  # not ready
        st("b0", epoch=3, ready=True, slave_links=()),  # not replicating from the acting slave
        st("b0", epoch=2, ready=True, slave_links=("b1",)),  # has not applied this epoch
        st("b0", epoch=3, eff=Permission.FULL, ready=True, slave_links=("b1",)),  # not isolated
    ],
)
def test_master_not_ready_keeps_slave_consume(master_status: BrokerStatus) -> None:
    c = cfg()
    views = (up("b0", master_status), up("b1", st("b1", epoch=3, eff=Permission.READ)), gone("b2"))
    assert decide(c, SC3, obs(0, *views), Memory()).target is None


def test_acting_death_fences_it_before_another_slave() -> None:
    c = cfg()
    views = (gone("b0"), gone("b1", X), up("b2", st("b2", epoch=4, offset=4)))
    d = decide(c, SC3, obs(0, *views), Memory())
    assert d.target is not None
    assert (d.target.mode, d.target.epoch, d.target.acting) == (Mode.FENCING, 4, "b1")
    # Then FENCING proves b1 cannot read and hands reads to b2 (link rule waived: the
    # master is long gone and b2 is not the one being fenced).
    d2 = decide(c, d.target, obs(0.01, *views), d.memory)
    assert d2.target is not None
    assert (d2.target.mode, d2.target.epoch, d2.target.acting) == (Mode.SLAVE_CONSUME, 5, "b2")


def test_stopped_acting_is_fenced_but_not_replaced_until_proven() -> None:
    c = cfg()
    stopped = BrokerView("b1", zk_live=True, process=S, status=st("b1", epoch=3, eff=Permission.READ))
    views = (gone("b0"), stopped, up("b2", st("b2", epoch=3)))
    d = decide(c, SC3, obs(0, *views), Memory())
    assert d.target is None  # ambiguous: wait for the window
    d = decide(c, SC3, obs(0.3, *views), d.memory)
    assert d.target is not None
    assert d.target.mode is Mode.FENCING
    d2 = decide(c, d.target, obs(0.4, *views), d.memory)
    assert d2.target is None  # b1 still has a session and never acked: no second reader
    views2 = (gone("b0"), replace(stopped, zk_live=False), up("b2", st("b2", epoch=4)))
    d3 = decide(c, d.target, obs(2.5, *views2), d2.memory)
    # proof seen; b2 is the only candidate, so no fresh offsets are needed to pick it
    assert d3.target is not None
    assert d3.target.acting == "b2"


def test_acting_death_with_no_other_slave_stays() -> None:
    c = cfg(slaves=1)
    d = decide(c, SC3, obs(0, gone("b0"), gone("b1")), Memory())
    assert d.target is None
    assert d.degraded


# ----------------------------------------------------------------- RECOVERING

REC4 = GroupState(Mode.RECOVERING, 4, acting="b1")


def test_backsync_persisted_returns_to_normal() -> None:
    c = cfg()
    master = up("b0", st("b0", epoch=4, backsync=4, ready=True, slave_links=("b1",)))
    d = decide(c, REC4, obs(2.0, master, up("b1", st("b1", epoch=4))), Memory(epoch=4, entered_at=1.5))
    assert d.target is not None
    assert (d.target.mode, d.target.epoch, d.target.acting) == (Mode.NORMAL, 5, None)
    assert d.phases == (("backsync", pytest.approx(0.5)),)


def test_stale_backsync_epoch_does_not_count() -> None:
    c = cfg()
    master = up("b0", st("b0", epoch=4, backsync=2, ready=True, slave_links=("b1",)))
    d = decide(c, REC4, obs(2.0, master, up("b1", st("b1", epoch=4))), Memory(epoch=4, entered_at=1.5))
    assert d.target is None
    assert d.recheck_in == pytest.approx(9.5)


def test_backsync_timeout_returns_reads_to_acting_and_backs_off() -> None:
    c = cfg(timeout=3.0)
    master = up("b0", st("b0", epoch=4, ready=True, slave_links=("b1",)))
    views = (master, up("b1", st("b1", epoch=4)), gone("b2"))
    d = decide(c, REC4, obs(3.0, *views), Memory(epoch=4, entered_at=0.0))
    assert d.target is not None
    assert (d.target.mode, d.target.epoch, d.target.acting) == (Mode.SLAVE_CONSUME, 5, "b1")
    assert "not persisted within 3s" in d.reason
    # Retried later, not at once.
    master5 = up("b0", st("b0", epoch=5, ready=True, slave_links=("b1",)))
    views5 = (master5, up("b1", st("b1", epoch=5, eff=Permission.READ)), gone("b2"))
    d2 = decide(c, d.target, obs(3.1, *views5), d.memory)
    assert d2.target is None
    assert d2.recheck_in == pytest.approx(2.9)
    d3 = decide(c, d.target, obs(6.0, *views5), d2.memory)
    assert d3.target is not None
    assert d3.target.mode is Mode.RECOVERING


def test_master_lost_during_backsync_hands_reads_back() -> None:
    c = cfg()
    d = decide(c, REC4, obs(0, gone("b0"), up("b1", st("b1", epoch=4))), Memory())
    assert d.target is not None
    assert (d.target.mode, d.target.acting) == (Mode.SLAVE_CONSUME, "b1")


def test_master_and_acting_lost_during_backsync_stays() -> None:
    c = cfg(slaves=1)
    d = decide(c, REC4, obs(0, gone("b0"), gone("b1")), Memory())
    assert d.target is None
    assert d.degraded


def test_foreign_state_restarts_timers() -> None:
    c = cfg(timeout=3.0)
    master = up("b0", st("b0", epoch=4, ready=True, slave_links=("b1",)))
    # This controller remembers epoch 2; it learns of RECOVERING 4 at t=100.
    d = decide(c, REC4, obs(100.0, master, up("b1", st("b1", epoch=4))), Memory(epoch=2, entered_at=0))
    assert d.target is None
    assert d.memory.entered_at == 100.0


# ----------------------------------------------------------------- force-mode


def test_force_slave_consume_refuses_dead_or_master_or_reading_master() -> None:
    c = cfg()
    views = obs(0, up("b0", st("b0", epoch=1, eff=Permission.FULL)), up("b1", st("b1", epoch=1)),
                gone("b2"))
    with pytest.raises(ForceRefused, match="not a live eligible slave"):
        plan_force(c, NORMAL1, views, mode=Mode.SLAVE_CONSUME, acting="b2")
    with pytest.raises(ForceRefused, match="is the master"):
        plan_force(c, NORMAL1, views, mode=Mode.SLAVE_CONSUME, acting="b0")
    with pytest.raises(ForceRefused, match="two brokers READ"):
        plan_force(c, NORMAL1, views, mode=Mode.SLAVE_CONSUME, acting="b1")
    with pytest.raises(ForceRefused, match="no broker"):
        plan_force(c, NORMAL1, views, mode=Mode.SLAVE_CONSUME, acting="nope")


def test_force_slave_consume_refuses_a_lagging_slave_unless_accepted() -> None:
    c = cfg()
    views = obs(0, gone("b0"), up("b1", st("b1", epoch=2, offset=3)), up("b2", st("b2", epoch=2, offset=8)))
    with pytest.raises(ForceRefused, match="behind b2"):
        plan_force(c, FENCING2, views, mode=Mode.SLAVE_CONSUME, acting="b1")
    new = plan_force(c, FENCING2, views, mode=Mode.SLAVE_CONSUME, acting="b1", accept_rewind=True)
    assert (new.mode, new.epoch, new.acting) == (Mode.SLAVE_CONSUME, 3, "b1")


def test_force_normal_refuses_before_backsync() -> None:
    c = cfg()
    master = up("b0", st("b0", epoch=3, backsync=None))
    views = obs(0, master, gone("b1"), gone("b2"))
    with pytest.raises(ForceRefused, match="back-synced"):
        plan_force(c, SC3, views, mode=Mode.NORMAL)
    # The acting slave is gone for good: the human may accept the rewind (b1 is proven).
    new = plan_force(c, SC3, views, mode=Mode.NORMAL, accept_rewind=True, reason="disk lost")
    assert (new.mode, new.epoch, new.acting) == (Mode.NORMAL, 4, None)
    assert "disk lost" in new.reason


def test_force_normal_never_gives_two_readers_even_accepting_rewind() -> None:
    c = cfg()
    views = obs(0, up("b0", st("b0", epoch=3)), up("b1", st("b1", epoch=3, eff=Permission.READ)), gone("b2"))
    with pytest.raises(ForceRefused, match="b1 may still hold READ"):
        plan_force(c, SC3, views, mode=Mode.NORMAL, accept_rewind=True)


def test_force_fencing_is_always_allowed_and_targets_the_reader() -> None:
    c = cfg()
    views = obs(0, up("b0"), up("b1", st("b1", epoch=3, eff=Permission.READ)), gone("b2"))
    new = plan_force(c, SC3, views, mode=Mode.FENCING)
    assert (new.mode, new.epoch, new.acting) == (Mode.FENCING, 4, "b1")
    with pytest.raises(ForceRefused, match="no --acting"):
        plan_force(c, SC3, views, mode=Mode.FENCING, acting="b2")


def test_force_recovering_only_from_the_acting_slave() -> None:
    c = cfg()
    views = obs(0, up("b0"), up("b1"), up("b2"))
    with pytest.raises(ForceRefused, match="no acting slave"):
        plan_force(c, NORMAL1, views, mode=Mode.RECOVERING)
    with pytest.raises(ForceRefused, match="must come from b1"):
        plan_force(c, SC3, views, mode=Mode.RECOVERING, acting="b2")
    assert plan_force(c, SC3, views, mode=Mode.RECOVERING).acting == "b1"


# ----------------------------------------------------------------- in-sync set


def test_only_in_sync_slaves_are_eligible() -> None:
    c = cfg()
    views = (gone("b0"), *slaves_link_down(2, (9, 3)))
    o = Observation(now=0, wall=0, brokers={v.name: v for v in views},
                    in_sync=frozenset({"b2"}))
    d = decide(c, FENCING2, o, Memory())
    assert d.target is not None
    assert d.target.acting == "b2"  # b1 has more offset but may miss acknowledged commits


def test_no_in_sync_slave_means_no_failover() -> None:
    c = cfg()
    views = (gone("b0"), *slaves_link_down(1))
    o = Observation(now=0, wall=0, brokers={v.name: v for v in views}, in_sync=frozenset())
    d = decide(c, NORMAL1, o, Memory())
    assert d.target is None
    assert "no eligible slave" in d.reason


def test_force_refuses_an_out_of_sync_slave() -> None:
    c = cfg()
    views = (gone("b0"), up("b1", st("b1", epoch=2)), up("b2", st("b2", epoch=2)))
    o = Observation(now=0, wall=0, brokers={v.name: v for v in views}, in_sync=frozenset({"b2"}))
    with pytest.raises(ForceRefused, match="not in the in-sync set"):
        plan_force(c, FENCING2, o, mode=Mode.SLAVE_CONSUME, acting="b1")
    assert plan_force(c, FENCING2, o, mode=Mode.SLAVE_CONSUME, acting="b1",
                      accept_rewind=True).acting == "b1"



@pytest.mark.parametrize("slaves", [1, 2])
def test_a_single_candidate_takes_reads_on_the_proof_without_waiting_for_fresh_offsets(
    slaves: int,
) -> None:
    """Fresh offsets only rank candidates; with one there is nothing to rank, so a hung
    master's session expiry hands reads over at once (no wait for the slave to republish).
    With two slaves, the second is down here."""
    c = cfg(slaves)
    master = gone("b0", S)  # session gone, process stopped: ambiguous
    b1, b2 = slaves_link_down(2, (7, 9))
    views = (b1,) if slaves == 1 else (b1, replace(b2, zk_live=False))
    d = decide(c, FENCING2, obs(0, master, *views), Memory(epoch=2, entered_at=0))
    assert d.target is not None, d.reason
    assert (d.target.mode, d.target.acting) == (Mode.SLAVE_CONSUME, "b1")
