"""``understudy workload`` against a real local cluster (ZooKeeper, master, slave and
controller processes on 127.0.0.1): the history it writes, merged with the brokers'
permission-change logs exactly as the drill merges them, is judged clean by the shared
checker; bad input is refused before anything is written."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from understudy_harness.checker import check
from understudy_harness.cli.workload import parse_bootstrap, workload
from understudy_harness.drill import merge_permission_logs
from understudy_harness.history import Deliver, HistoryWriter, Own, Perm, ProduceAck, read_history
from understudy_harness.workload import Target, Traffic, TrafficCounts
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs
from understudy_operator.local.plan import ClusterPlan
from understudy_operator.local.ports import free_port


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterPlan]:
    """One group (master + slave) with its controller; stopped by PID whatever happens."""
    directory = tmp_path / "cluster"
    try:
        yield lc.up(directory, groups=1, slaves=1)
    finally:
        with contextlib.suppress(Exception):
            lc.down(directory)
        procs.kill_leftovers(directory)  # anything down() could not stop


@pytest.mark.integration
def test_workload_history_is_judged_clean_by_the_checker(cluster: ClusterPlan, tmp_path: Path) -> None:
    history = cluster.dir / "history.jsonl"
    bootstrap = ",".join(cluster.bootstrap(cluster.groups[0].group))
    result = CliRunner().invoke(
        workload,
        ["--bootstrap", bootstrap, "--topic", "wl", "--groups", "2", "--rate", "100",
         "--duration", "3", "--drain-timeout", "30", "--history", str(history)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["drained"] is True
    assert summary["acked"] > 0
    assert summary["delivered"] >= 2 * summary["acked"]
    assert summary["history"] == str(history)

    lc.down(cluster.dir)  # a clean stop writes each broker's last permission line
    assert merge_permission_logs(cluster, history) > 0
    loaded = read_history(history)
    assert loaded.header["clock"] == "time_ns"  # the brokers' permission logs' clock
    acks = [e for e in loaded.events if isinstance(e, ProduceAck)]
    assert len(acks) == summary["acked"]
    assert all(e.id.startswith("wl-") and e.topic == "wl" for e in acks)
    assert {e.broker for e in loaded.events if isinstance(e, Perm)} == {b.name for b in cluster.groups[0].brokers}
    report = check(loaded.events)
    assert report.ok, report.violations
    assert report.acked == summary["acked"]
    assert report.lost_acked == 0
    assert report.one_reader_violations == 0


def test_bootstrap_parsing() -> None:
    assert parse_bootstrap("a:1,127.0.0.1:9876") == ("a:1", "127.0.0.1:9876")
    # The client commands' rule (one copy, model.parse_address_list): empty entries are
    # skipped, as `understudy produce --bootstrap` always did.
    assert parse_bootstrap(" a:1,,b:2, ") == ("a:1", "b:2")
    for bad in ("nohost", "a:", ":9", "a:x", "a:1,x"):
        with pytest.raises(ValueError, match="expected HOST:PORT"):
            parse_bootstrap(bad)
    for bad in ("", " , "):
        with pytest.raises(ValueError, match="at least one HOST:PORT is needed"):
            parse_bootstrap(bad)
    for bad in ("a:70000", "a:0"):
        with pytest.raises(ValueError, match=f"port {int(bad[2:])} is outside 1-65535 in {bad!r}"):
            parse_bootstrap(bad)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bootstrap", "localhost"], "expected HOST:PORT, got 'localhost'"),
        (["--bootstrap", "127.0.0.1:1", "--rate", "0"], "--rate"),
        (["--bootstrap", "127.0.0.1:1", "--groups", "0"], "--groups"),
    ],
)
def test_bad_flags_exit_2_and_write_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    history = tmp_path / "h.jsonl"
    result = CliRunner().invoke(workload, [*args, "--topic", "t", "--history", str(history)])
    assert result.exit_code == 2
    assert message in result.output
    assert not history.exists()


def test_an_existing_history_is_never_appended_to(tmp_path: Path) -> None:
    history = tmp_path / "h.jsonl"
    history.write_text('{"type":"header","t":1,"clock":"time_ns","version":1}\n')
    before = history.read_bytes()
    result = CliRunner().invoke(
        workload, ["--bootstrap", "127.0.0.1:1", "--topic", "t", "--history", str(history)]
    )
    assert result.exit_code == 2
    assert "already holds a history" in result.output
    assert history.read_bytes() == before


def test_a_missing_history_directory_is_a_clear_error(tmp_path: Path) -> None:
    history = tmp_path / "nope" / "h.jsonl"
    result = CliRunner().invoke(workload, ["--bootstrap", "127.0.0.1:1", "--topic", "t", "--history", str(history)])
    assert result.exit_code == 2
    assert "does not exist" in result.output


@pytest.mark.integration
def test_no_broker_listening_exits_1_naming_the_topic(tmp_path: Path) -> None:
    history = tmp_path / "h.jsonl"
    result = CliRunner().invoke(
        workload,
        ["--bootstrap", f"127.0.0.1:{free_port()}", "--topic", "t", "--duration", "0", "--history", str(history)],
    )
    assert result.exit_code == 1, result.output
    assert "cannot create topic 't'" in result.output


MANIFEST = Path(__file__).resolve().parents[2] / "e2e" / "manifests" / "workload.yaml"
PLACEHOLDERS = {"GROUP", "NAMESPACE", "IMAGE", "RATE", "DURATION", "RUN"}  # e2e/test_chaos.py fills these


def _rendered_manifest() -> dict[str, object]:
    import re

    import yaml

    text = MANIFEST.read_text()
    assert set(re.findall(r"@([A-Z]+)@", text)) == PLACEHOLDERS
    values = {"GROUP": "orders", "NAMESPACE": "e2e-x", "IMAGE": "understudy/broker:e2e", "RATE": "100",
              "DURATION": "90", "RUN": "kill-9"}  # fmt: skip
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    doc = yaml.safe_load(text)
    assert isinstance(doc, dict)
    return doc


def test_the_e2e_job_is_valid_kubernetes() -> None:
    import kubernetes_validate

    for version in ("1.29", "1.33"):
        kubernetes_validate.validate(_rendered_manifest(), version, strict=True)


def test_the_e2e_job_runs_a_workload_command_this_cli_accepts() -> None:
    import shlex

    doc: Any = _rendered_manifest()
    script = doc["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    joined = script.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if ln.strip().startswith("understudy workload"))
    argv = shlex.split(line.split(">")[0])[2:]
    ctx = workload.make_context("workload", argv)  # raises click's usage error on a bad flag
    assert ctx.params["bootstrap"] == ("orders-0.e2e-x.svc:9876", "orders-1.e2e-x.svc:9876")
    assert ctx.params["history"] == Path("/tmp/history.jsonl")
    assert "HISTORY-BEGIN" in script
    assert "HISTORY-END" in script


# ---- how a member's deliveries are dated (no broker: a scripted Consumer) ---------------


class _Clock:
    """The history's clock, moved on by :class:`_SlowWriter`."""

    def __init__(self) -> None:
        self.ns = 1_795_000_000_000_000_000

    def __call__(self) -> int:
        return self.ns


class _SlowWriter(HistoryWriter):
    """Writing an event takes 1 ms (a big batch takes the event loop that long)."""

    def __init__(self, path: Path, clock: _Clock) -> None:
        super().__init__(path, clock=clock, clock_name="test")
        self.clock = clock

    def record(self, event: Any) -> None:
        self.clock.ns += 1_000_000
        super().record(event)


@dataclasses.dataclass(frozen=True)
class _Rec:
    topic: str
    queue: int
    offset: int
    body: bytes
    reconsume_times: int = 0


class _LeaseEndsWhileABatchIsWritten:
    """A member that hands out one batch of queue 1 inside its lease; the lease ends 5 ms
    later, while the drill still writes the batch (1 ms per event). As the real client
    does, its ownership log dates the release at the lease's end; the next heartbeat
    re-joins and keeps the queue (the brokers never expired it)."""

    clock: _Clock
    traffic: Traffic

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        self.ownership_log: list[tuple[float, str, int]] = []
        self.started_at: dict[int, int] = {}
        self.on_read_restored: Any = None
        self.calls = 0

    def _log(self, ns: int, what: str) -> None:
        self.ownership_log.append((ns / 1e9, what, 1))

    async def start(self) -> None:
        self._log(self.clock(), "acquire")

    async def getmany(self, *, timeout_s: float) -> list[_Rec]:
        self.calls += 1
        if self.calls == 1:
            self.handed = self.clock.ns
            return [_Rec("t", 1, i, f"t-{i}".encode()) for i in range(50)]
        self._log(self.handed + 5_000_000, "release")  # the lease ended then
        self._log(self.clock(), "acquire")
        self.traffic.stop.set()
        return []

    async def commit(self, *, timeout_s: float | None = None) -> dict[int, int | None]:
        return {}

    async def close(self) -> None:
        self._log(self.clock(), "release")


def test_a_members_deliveries_are_dated_when_handed_out_not_when_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease that ends while a handed-out batch is still being written is not a pull of
    a queue the member no longer owns: the batch was handed out inside the lease. Dated as
    written, 45 of the 50 deliveries fell after the release (the drill's ordered scenario
    counted 2,812 such "two members on one queue" violations in one drain)."""
    import understudy_broker.client

    clock = _Clock()
    history = tmp_path / "history.jsonl"

    async def run() -> None:
        with _SlowWriter(history, clock) as writer:
            traffic = Traffic([Target(label="t", topic="t", bootstrap=("127.0.0.1:1",),
                                      groups=("g1",))],
                              writer, TrafficCounts(), rate=1.0, queues=1,
                              consumer_groups=("cg1",), members=1)
            _LeaseEndsWhileABatchIsWritten.clock = clock
            _LeaseEndsWhileABatchIsWritten.traffic = traffic
            monkeypatch.setattr(understudy_broker.client, "Consumer",
                                _LeaseEndsWhileABatchIsWritten)
            task = traffic.member_runs[traffic.add_member(traffic.targets[0], "cg1")].task
            assert task is not None
            async with asyncio.timeout(5):
                await task

    asyncio.run(run())
    events = read_history(history).events
    delivers = [e for e in events if isinstance(e, Deliver)]
    owns = [e for e in events if isinstance(e, Own)]
    assert len(delivers) == 50
    assert [o.held for o in sorted(owns, key=lambda o: o.t)] == [True, False, True, False]
    report = check(events)
    assert report.two_member_violations == 0, report.shared_queues
    release = sorted(owns, key=lambda o: o.t)[1].t
    assert all(d.t < release for d in delivers)  # handed out inside the lease
