"""The kind suite's history assembly as pure functions: the workload Job's log block, the
brokers' ``GET /permissions`` answers (PID 1 in every container incarnation), and the
merge the shared checker judges."""

from __future__ import annotations

import base64
import gzip
import json
import subprocess

import pytest

from understudy_broker.ha.permlog import PermissionChange
from understudy_broker.model import Mode, Permission
from understudy_harness.checker import check
from understudy_harness.history import (
    Commit,
    Deliver,
    Fault,
    HistoryError,
    ModeChange,
    Perm,
    ProduceAck,
    event_to_dict,
    iter_jsonl,
)
from understudy_harness.permevents import (
    broker_perm_events,
    parse_permission_log,
    split_incarnations,
)
from understudy_harness.workload_history import (
    merge_events,
    parse_history_text,
    parse_workload_logs,
)

S = 1_000_000_000  # one second in ns
READ, NONE, FULL = Permission.READ, Permission.NONE, Permission.FULL


def change(t: int, effective: Permission, *, broker: str = "orders-0", pid: int = 1, epoch: int = 1,
           start: bool = False) -> PermissionChange:
    return PermissionChange(t_ns=t, group="orders", broker=broker, effective=effective, epoch=epoch, pid=pid,
                            start=start)


def served(*changes: PermissionChange) -> str:
    return "".join(c.to_json() + "\n" for c in changes)


def job_log(summary: dict[str, object], history_text: str, *, noise: str = "") -> str:
    """What the Job prints: the same shape as e2e/manifests/workload.yaml (base64 wraps at 76)."""
    block = base64.encodebytes(gzip.compress(history_text.encode())).decode()
    return f"{noise}SUMMARY {json.dumps(summary)}\nHISTORY-BEGIN\n{block}HISTORY-END\n"


# --------------------------------------------------------------- permission logs


def test_served_log_round_trips() -> None:
    changes = [change(1, NONE), change(2, FULL)]
    assert parse_permission_log(served(*changes) + "\n", source="orders-0") == changes


@pytest.mark.parametrize(
    "line",
    ['{"t_ns":1}', "not json", "[1,2]", '{"t_ns":"x","group":"g","broker":"b","effective":"READ","epoch":1}',
     '{"t_ns":1,"group":"g","broker":"b","effective":"MAYBE","epoch":1}'],
)  # fmt: skip
def test_a_bad_served_line_names_the_broker_and_line(line: str) -> None:
    with pytest.raises(HistoryError, match=r"orders-1:2: not a permission change"):
        parse_permission_log(served(change(1, NONE)) + line + "\n", source="orders-1")


def test_incarnations_split_at_kills_even_with_the_same_pid() -> None:
    logged = split_incarnations([change(1, NONE), change(2, FULL), change(10, NONE), change(11, FULL)], kills=[5])
    assert [c.pid for c in logged[:2]] == [1, 1]
    assert logged[2].pid == logged[3].pid != 1


def test_a_line_the_killed_container_writes_after_the_kill_stays_with_it() -> None:
    # PID 1 takes FULL back at 2 s; the kill is recorded at 5 s, just before the signal,
    # and the dying process still logs a new epoch at 5.01 s; it restarts at 8 s.
    late = 5 * S + 10_000_000
    lines = [(1 * S, NONE, True), (2 * S, FULL, False), (late, FULL, False), (8 * S, NONE, True), (9 * S, FULL, False)]
    changes = [change(t, eff, start=start, epoch=i) for i, (t, eff, start) in enumerate(lines)]
    kill = Fault(5 * S, 1, "kill-9", "orders-0", "orders")
    events = broker_perm_events(group="orders", broker="orders-0", role="master", changes=changes, faults=[kill])
    # READ ends with the dying process's last line, not when the next one starts.
    assert [(e.t, e.effective) for e in events] == [
        (1 * S, NONE), (2 * S, FULL), (late, FULL), (late, NONE), (8 * S, NONE), (9 * S, FULL)]
    # Split at the kill instead (a log without start marks), the late line would start
    # the next incarnation and hold READ through the downtime, until 8 s.
    unmarked = [change(t, eff, epoch=i) for i, (t, eff, _start) in enumerate(lines)]
    events = broker_perm_events(group="orders", broker="orders-0", role="master", changes=unmarked, faults=[kill])
    assert (late, FULL) in [(e.t, e.effective) for e in events]
    assert (late, NONE) not in [(e.t, e.effective) for e in events]


def test_kill_9_ends_read_at_the_kill_and_delete_pod_needs_no_help() -> None:
    # PID 1 holds FULL, is SIGKILLed at t=5 s (no last line), restarts at 8 s with NONE.
    changes = [change(1 * S, NONE), change(2 * S, FULL), change(8 * S, NONE), change(9 * S, FULL)]
    fault = Fault(5 * S, 1, "kill-9", "orders-0", "orders")
    events = broker_perm_events(group="orders", broker="orders-0", role="master", changes=changes, faults=[fault])
    assert [(e.t, e.effective) for e in events] == [(1 * S, NONE), (2 * S, FULL), (5 * S, NONE), (8 * S, NONE), (9 * S, FULL)]
    assert {e.role for e in events} == {"master"}
    # A deleted pod stops gracefully and logs NONE itself: nothing is invented for it.
    graceful = [change(1 * S, FULL), change(6 * S, NONE), change(9 * S, FULL)]
    deleted = Fault(5 * S, 1, "delete-pod", "orders-0", "orders")
    events = broker_perm_events(group="orders", broker="orders-0", role="master", changes=graceful, faults=[deleted])
    assert [(e.t, e.effective) for e in events] == [(c.t_ns, c.effective) for c in graceful]


def test_a_kill_of_another_broker_changes_nothing() -> None:
    changes = [change(1 * S, READ, broker="orders-1"), change(8 * S, NONE, broker="orders-1")]
    fault = Fault(5 * S, 1, "kill-9", "orders-0", "orders")
    events = broker_perm_events(group="orders", broker="orders-1", role="slave", changes=changes, faults=[fault])
    assert [(e.t, e.effective) for e in events] == [(1 * S, READ), (8 * S, NONE)]


# ---------------------------------------------------------------- the Job's log


def test_the_job_log_block_round_trips_with_noise_around_it() -> None:
    events = [ProduceAck(3, "wl-0", "wl", 0, 0), Deliver(4, "cg1", "wl", 0, 0, "wl-0"), Commit(5, "cg1", "wl", 0, 1)]
    text = '{"type":"header","t":1,"clock":"time_ns","version":1}\n' + "\n".join(iter_jsonl(events)) + "\n"
    out = parse_workload_logs(job_log({"acked": 1, "drained": True}, text, noise="creating topic\n"))
    assert out.summary == {"acked": 1, "drained": True}
    assert out.events == events


def test_the_manifest_shell_pipeline_decodes() -> None:
    """gzip -c | base64 (coreutils, as in the Job) decodes to the same events."""
    text = "\n".join(iter_jsonl([ProduceAck(i, f"wl-{i}", "wl", 0, i) for i in range(2000)])) + "\n"
    block = subprocess.run(["sh", "-c", "gzip -c | base64"], input=text.encode(), capture_output=True, check=True).stdout.decode()
    out = parse_workload_logs(f'SUMMARY {{"acked":2000}}\nHISTORY-BEGIN\n{block}HISTORY-END\n')
    assert len(out.events) == 2000


@pytest.mark.parametrize(
    ("logs", "message"),
    [
        ("HISTORY-BEGIN\nAAAA\nHISTORY-END\n", "no SUMMARY line"),
        ('SUMMARY {"acked":1}\n', "no complete HISTORY-BEGIN"),
        ('SUMMARY {"acked":1}\nHISTORY-BEGIN\nH4sI\n', "no complete HISTORY-BEGIN"),  # Job cut off
        ('SUMMARY {"acked":1}\nHISTORY-BEGIN\n!!!!\nHISTORY-END\n', "damaged"),
        ('SUMMARY {"acked":1}\nHISTORY-BEGIN\nAAAAAAAA\nHISTORY-END\n', "damaged"),
        ("SUMMARY [1]\nHISTORY-BEGIN\nHISTORY-END\n", "not a JSON object"),
        ("SUMMARY {\nHISTORY-BEGIN\nHISTORY-END\n", "summary is not JSON"),
    ],
)
def test_a_damaged_job_log_is_a_clear_error(logs: str, message: str) -> None:
    with pytest.raises(HistoryError, match=message):
        parse_workload_logs(logs)


def test_a_bad_history_line_names_its_line() -> None:
    good = json.dumps(event_to_dict(ProduceAck(1, "a", "t", 0, 0)))
    with pytest.raises(HistoryError, match=r"workload history:2: produce_ack is missing field 'offset'"):
        parse_workload_logs(job_log({}, good + '\n{"type":"produce_ack","t":2,"id":"b","topic":"t","queue":0}\n'))
    with pytest.raises(HistoryError, match=r"h:1: not JSON"):
        parse_history_text("{torn\n", source="h")


# -------------------------------------------------------------------- merging


def test_merge_orders_by_time_and_keeps_ties_in_source_order() -> None:
    a = [ProduceAck(1, "x", "t", 0, 0), ProduceAck(5, "y", "t", 0, 1)]
    b = [ModeChange(3, "orders", Mode.SLAVE_CONSUME, 2), ModeChange(5, "orders", Mode.NORMAL, 4)]
    assert [e.t for e in merge_events(a, b)] == [1, 3, 5, 5]
    assert merge_events(a, b)[2] == a[1]


def _judged(slave_read_from: int) -> tuple[int, int]:
    """A merged run: one message, master killed at 5 s, slave reads from ``slave_read_from``."""
    workload = [ProduceAck(1 * S, "wl-0", "wl", 0, 0), Deliver(2 * S, "cg1", "wl", 0, 0, "wl-0"),
                Commit(2 * S, "cg1", "wl", 0, 1)]  # fmt: skip
    faults = [Fault(5 * S, 1, "kill-9", "orders-0", "orders")]
    master = broker_perm_events(
        group="orders", broker="orders-0", role="master",
        changes=[change(0, FULL), change(8 * S, NONE), change(12 * S, FULL)], faults=faults,
    )  # fmt: skip
    slave = broker_perm_events(
        group="orders", broker="orders-1", role="slave",
        changes=[change(0, NONE, broker="orders-1"), change(slave_read_from, READ, broker="orders-1"),
                 change(11 * S, NONE, broker="orders-1")],
        faults=faults,
    )  # fmt: skip
    report = check(merge_events(workload, faults, master, slave))
    return report.one_reader_violations, report.lost_acked


def test_the_checker_judges_a_merged_kind_history() -> None:
    # The kill ends the master's READ at 5 s: a slave reading from 6 s overlaps nobody...
    assert _judged(6 * S) == (0, 0)
    # ...one reading from 4 s overlaps the still-living master: a one-reader violation.
    assert _judged(4 * S) == (1, 0)


def test_perm_events_are_history_events() -> None:
    events = broker_perm_events(group="g", broker="g-0", role="master", changes=[change(1, FULL, broker="g-0")], faults=[])
    assert events == [Perm(1, "g", "g-0", FULL, "master")]
