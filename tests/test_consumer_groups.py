"""Consumer groups held by brokers, on a real local cluster (ZooKeeper, two groups of
broker processes, the controller): members joining, leaving cleanly, crashing and
pausing past their session, and a rebalance while a group is in SLAVE_CONSUME. Checked
as a user would: every message consumed, no duplicate on clean joins and leaves, and never
two members on one queue (from the members' own acquire/release records)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from understudy_broker import protocol as p
from understudy_broker.admin import describe_consumer_group, describe_topic
from understudy_broker.cli.client import consumer_group, topic
from understudy_broker.client import BrokerError, Connection, Consumer, Producer, request_once
from understudy_broker.zklayout import TopicDoc, topic_path
from understudy_harness import testing
from understudy_operator.local import cluster as lc
from understudy_operator.local.plan import ClusterPlan
from understudy_operator.local.ports import free_port

pytestmark = pytest.mark.slow
UNDERSTUDY = testing.UNDERSTUDY


@pytest.fixture(scope="module")
def cluster(two_groups: tuple[Path, ClusterPlan]) -> tuple[Path, ClusterPlan]:
    return two_groups


def addr(plan: ClusterPlan, broker: str) -> str:
    return plan.address(broker)


def make_topic(plan: ClusterPlan, name: str, per_group: int = 4) -> None:
    out = CliRunner().invoke(topic, ["create", "-b", addr(plan, "g1-0"), "-t", name,
                                     "--groups", "g1,g2", "--queues-per-group", str(per_group)])
    assert out.exit_code == 0, out.output


async def produce(boot: list[str], name: str, bodies: Iterable[bytes]) -> None:
    # No hedge: a batch unanswered for 500 ms on a loaded machine would also be stored on
    # the other group (at least once, docs/cluster.md), and these tests count duplicates
    # the consumers make, so every message is stored once.
    async with Producer(boot, hedge_after_ms=None) as prod:
        futs = [await prod.send(name, b) for b in bodies]
        await prod.flush()
    assert all(f.exception() is None for f in futs)


def overlaps(events: Iterable[tuple[float, str, int, str]]) -> list[str]:
    """Two members holding one queue at once, from (time, acquire|release, queue, member)."""
    holder: dict[int, str] = {}
    bad = []
    for _t, kind, q, member in sorted(events):
        if kind == "acquire":
            if q in holder and holder[q] != member:
                bad.append(f"queue {q}: {member} acquired while {holder[q]} held it")
            holder[q] = member
        elif holder.get(q) == member:
            del holder[q]
    return bad


def log_of(c: Consumer) -> list[tuple[float, str, int, str]]:
    return [(t, k, q, c.member_id) for t, k, q in c.ownership_log]


async def drain(c: Consumer, seen: list[bytes], stop: asyncio.Event) -> None:
    while not stop.is_set():
        recs = await c.getmany(timeout_s=0.1)
        if recs:
            seen.extend(r.body for r in recs)
            try:
                await c.commit()
            except BrokerError as exc:  # as an application would: commit again later
                if not exc.retriable:
                    raise


def test_clean_joins_and_leaves_move_queues_without_duplicates(
        cluster: tuple[Path, ClusterPlan]) -> None:
    _d, plan = cluster
    boot = [addr(plan, "g1-0"), addr(plan, "g2-0")]
    make_topic(plan, "shared")

    async def run() -> None:
        await produce(boot, "shared", (b"a-%d" % i for i in range(400)))
        seen_a: list[bytes] = []
        seen_b: list[bytes] = []
        stop = asyncio.Event()
        a = Consumer(boot, group="cg", topic="shared", session_timeout_ms=3000, max_wait_ms=100)
        b = Consumer(boot, group="cg", topic="shared", session_timeout_ms=3000, max_wait_ms=100)
        try:
            await a.start()
            assert a.assigned == list(range(8))  # alone: every queue
            ta = asyncio.create_task(drain(a, seen_a, stop))
            await testing.eventually(lambda: len(seen_a) >= 100, "a consumed 100", 20)
            await b.start()
            tb = asyncio.create_task(drain(b, seen_b, stop))
            await testing.eventually(
                lambda: len(a.assigned) == 4 and len(b.assigned) == 4, "4 queues each", 20)
            assert not set(a.assigned) & set(b.assigned)
            await produce(boot, "shared", (b"b-%d" % i for i in range(400)))
            await testing.eventually(lambda: len(seen_a) + len(seen_b) >= 800, "800 consumed", 30)
            # a leaves cleanly: b takes everything, from a's commits.
            stop_a = asyncio.Event()
            stop_a.set()
            ta.cancel()
            await asyncio.gather(ta, return_exceptions=True)
            await a.close()
            await testing.eventually(lambda: len(b.assigned) == 8, "b holds all 8", 20)
            await produce(boot, "shared", (b"c-%d" % i for i in range(200)))
            await testing.eventually(lambda: len(seen_a) + len(seen_b) >= 1000, "1000", 30)
            stop.set()
            await asyncio.gather(tb, return_exceptions=True)
            d = await describe_consumer_group(boot, "cg")
            assert [m["member"] for m in d["members"]] == [b.member_id]
            assert {a_["member"] for a_ in d["assignment"]} == {b.member_id}
            assert sum(a_["lag"] for a_ in d["assignment"]) == 0
        finally:
            stop.set()
            await a.close()
            await b.close()
        counts = Counter(seen_a + seen_b)
        expected = {b"%s-%d" % (k, i) for k, n in ((b"a", 400), (b"b", 400), (b"c", 200))
                    for i in range(n)}
        assert set(counts) == expected
        assert [x for x, n in counts.items() if n > 1] == []  # clean moves: no duplicate
        assert overlaps([*log_of(a), *log_of(b)]) == []

    asyncio.run(run())

    # The readers export the group's lag (0: all consumed) and the brokers count rebalances.
    def series(broker: str, name: str) -> list[tuple[str, float]]:
        text = lc.http_get(plan.process(broker).http_port or 0, "/metrics") or ""
        return [(line.split(" ")[0], float(line.split(" ")[1])) for line in text.splitlines()
                if line.startswith(name + "{") and 'consumer_group="cg"' in line]

    lags = testing.wait_until(
        lambda: series("g1-0", "understudy_consumer_lag_messages")
        + series("g2-0", "understudy_consumer_lag_messages"),
        "8 lag series at 0 (refreshed every second)", 10,
        ok=lambda v: len(v) == 8 and all(x == 0 for _s, x in v))
    assert {s.split('queue="')[1].split('"')[0] for s, _v in lags} == {str(q) for q in range(8)}
    assert not series("g1-1", "understudy_consumer_lag_messages")  # slaves do not export it
    rebalances = sum(v for b in ("g1-0", "g1-1", "g2-0", "g2-1")
                     for _s, v in series(b, "understudy_rebalances_total"))
    assert rebalances >= 3  # a joined, b joined, a left
    listed = json.loads(CliRunner().invoke(consumer_group, [
        "list", "-b", addr(plan, "g2-1"), "--json"]).output)["groups"]
    cg = next(g for g in listed if g["group"] == "cg")
    assert cg["members"] == 0  # both left
    assert cg["generation"] >= 3


def test_a_member_stuck_in_processing_leaves_and_its_queues_move_long_before_its_session(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """A member whose application stops calling getmany() (stuck processing) keeps
    heartbeating, so its session never ends: without a poll interval its queues would
    wait for it. With ``max_poll_interval_ms`` it leaves: the other member takes its
    queues (the sessions here are 60 s; this happens in seconds) and delivers again
    what the stuck one was handed and never committed. Its next getmany() joins again,
    and no two members ever hold one queue."""
    _d, plan = cluster
    boot = [addr(plan, "g1-0"), addr(plan, "g2-0")]
    make_topic(plan, "stuck", per_group=2)

    async def run() -> None:
        stuck = Consumer(boot, group="cgs", topic="stuck", session_timeout_ms=60_000,
                         max_wait_ms=100, max_poll_interval_ms=1500)
        # The other member has the same interval and keeps calling getmany(): it stays.
        other = Consumer(boot, group="cgs", topic="stuck", session_timeout_ms=60_000,
                         max_wait_ms=100, max_poll_interval_ms=1500)
        seen_stuck: list[bytes] = []
        seen_other: list[bytes] = []
        stop_stuck, stop = asyncio.Event(), asyncio.Event()
        try:
            await stuck.start()
            ts = asyncio.create_task(drain(stuck, seen_stuck, stop_stuck))
            await other.start()
            to = asyncio.create_task(drain(other, seen_other, stop))
            await testing.eventually(
                lambda: len(stuck.assigned) == 2 and len(other.assigned) == 2, "2 queues each", 20)
            stop_stuck.set()
            await ts
            await produce(boot, "stuck", (b"s-%d" % i for i in range(200)))
            handed: list[bytes] = []
            while not handed:  # handed out from its own queues, never committed
                handed = [r.body for r in await stuck.getmany(timeout_s=1)]
            # Now it is "processing" and never calls getmany() again for a while.
            await testing.eventually(lambda: len(other.assigned) == 4,
                                     "the other member holds all 4 queues", 30)
            assert stuck.assigned == []
            await testing.eventually(
                lambda: {b"s-%d" % i for i in range(200)} <= set(seen_other),
                "every message consumed by the other member", 30)
            assert set(handed) <= set(seen_other)  # delivered again (at least once)
            # The application comes back: its next getmany() joins the group again.
            stop_stuck.clear()
            ts = asyncio.create_task(drain(stuck, seen_stuck, stop_stuck))
            await testing.eventually(
                lambda: len(stuck.assigned) == 2 and len(other.assigned) == 2,
                "2 queues each again", 30)
            stop_stuck.set()
            stop.set()
            await asyncio.gather(ts, to)
        finally:
            stop_stuck.set()
            stop.set()
            await stuck.close()
            await other.close()
        assert overlaps([*log_of(stuck), *log_of(other)]) == []

    asyncio.run(run())


def test_a_topic_created_through_one_broker_is_known_at_once_to_every_other(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """A broker hears of a new topic from a ZooKeeper watch (and a read it then makes), a
    moment after the node exists. A member that joins, or a client that asks for the
    route, in that moment is answered as if the watch had fired: CI once failed a join
    with UNKNOWN_TOPIC. The node is written here directly and the requests go out on
    connections already open, so they reach every broker inside that moment."""
    _d, plan = cluster
    brokers = ["g1-0", "g1-1", "g2-0", "g2-1"]

    async def run(name: str, zk: Any) -> list[tuple[str, p.Frame, p.Frame]]:
        conns = [await Connection.open(addr(plan, b)) for b in brokers]
        try:
            zk.create(topic_path(name), TopicDoc(name, ("g1", "g2")).to_json())
            hbs = [p.MemberHeartbeatRequest(f"cg-{name}", f"m-{b}", [name], 3000, join=True)
                   for b in brokers]
            joined = [c.exchange(p.Op.MEMBER_HEARTBEAT, hb.encode(), timeout_s=10)
                      for c, hb in zip(conns, hbs, strict=True)]
            routes = [c.exchange(p.Op.GET_ROUTE, p.GetRouteRequest(name).encode(), timeout_s=10)
                      for c in conns]
            answers = await asyncio.gather(*joined, *routes)
            n = len(brokers)
            return list(zip(brokers, answers[:n], answers[n:], strict=True))
        finally:
            for c in conns:
                await c.close()

    with testing.zk_session(plan.zk_connect) as zk:
        for i in range(4):
            for broker, joined, route in asyncio.run(run(f"fresh-{i}", zk)):
                assert joined.status == p.Status.OK, (broker, p.error_message(joined))
                assert route.status == p.Status.OK, (broker, p.error_message(route))
                assert p.RouteResponse.decode(route.body).topics.get(f"fresh-{i}") == 2, broker


def test_a_member_heartbeating_for_an_unknown_group_gets_a_clear_error(
        cluster: tuple[Path, ClusterPlan]) -> None:
    _d, plan = cluster
    make_topic(plan, "errs", per_group=1)

    async def ask(body: bytes) -> p.Frame:
        return await request_once(addr(plan, "g2-1"), p.Op.MEMBER_HEARTBEAT, body)

    hb = p.MemberHeartbeatRequest("nobody", "m1", ["errs"], 3000)
    frame = asyncio.run(ask(hb.encode()))
    assert frame.status == p.Status.UNKNOWN_MEMBER
    assert "no consumer group 'nobody'/'m1'" in p.error_message(frame)
    bad = p.MemberHeartbeatRequest("Bad_Group", "m1", ["errs"], 3000, join=True)
    assert asyncio.run(ask(bad.encode())).status == p.Status.BAD_REQUEST
    missing = p.MemberHeartbeatRequest("cg2", "m1", ["nope"], 3000, join=True)
    frame = asyncio.run(ask(missing.encode()))
    assert frame.status == p.Status.UNKNOWN_TOPIC
    d = json.loads(CliRunner().invoke(consumer_group, [
        "describe", "-b", addr(plan, "g1-0"), "-g", "nobody", "--json"]).output)
    assert d["members"] == []
    with testing.zk_session(plan.zk_connect) as zk:
        assert zk.exists("/consumers/nobody") is None  # nothing was created
        assert zk.exists("/consumers/cg2") is None  # the join for an unknown topic neither


def _spawn_member(plan: ClusterPlan, name: str, record: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [*UNDERSTUDY, "consume", "-b", addr(plan, "g1-1"), "-b", addr(plan, "g2-1"),
           "-t", "crashy", "-g", "cgc", "--count", "1000000", "--idle-timeout", "60",
           "--commit-every", "20", "--session-timeout-ms", "2000", "--member-id", name,
           "--record", str(record)]
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _records(*paths: Path) -> list[dict[str, Any]]:
    """The complete lines the members wrote so far: a member may be writing its last line
    while this reads (a line without its newline yet is left for the next read)."""
    out = []
    for path in paths:
        if path.exists():
            complete = path.read_text().rpartition("\n")[0]
            out += [json.loads(line) for line in complete.splitlines() if line.strip()]
    return out


def test_crashed_and_paused_members_lose_their_queues_without_sharing_them(
        cluster: tuple[Path, ClusterPlan], tmp_path: Path) -> None:
    """Three member processes; one is SIGSTOPped past its session, one is SIGKILLed while a
    group is in SLAVE_CONSUME (its master killed), and the group fails back meanwhile.
    Every message is consumed; no two members ever hold one queue."""
    directory, plan = cluster
    boot = [addr(plan, "g1-1"), addr(plan, "g2-0")]
    make_topic(plan, "crashy")
    names = ["m1", "m2", "m3"]
    records = {n: tmp_path / f"{n}.jsonl" for n in names}
    procs = {n: _spawn_member(plan, n, records[n], tmp_path / f"{n}.log") for n in names}
    try:
        asyncio.run(produce(boot, "crashy", (b"x-%d" % i for i in range(300))))
        testing.wait_until(lambda: len({r["member"] for r in _records(*records.values())
                                        if r["kind"] == "acquire"}) == 3, "3 members own queues", 30)
        os.kill(procs["m1"].pid, signal.SIGSTOP)  # paused past its 2 s session
        time.sleep(3.5)
        asyncio.run(produce(boot, "crashy", (b"y-%d" % i for i in range(300))))
        lc.kill(directory, "g1-0")  # g1 goes SLAVE_CONSUME: reads and commits on g1-1
        lc.wait_mode(plan, "g1", "SLAVE_CONSUME", deadline=time.monotonic() + 20)
        os.kill(procs["m2"].pid, signal.SIGKILL)  # crash during slave-consume
        procs["m2"].wait(5)
        asyncio.run(produce(boot, "crashy", (b"z-%d" % i for i in range(300))))
        os.kill(procs["m1"].pid, signal.SIGCONT)
        lc.start(directory, "g1-0")  # failback while the group rebalances
        lc.wait_mode(plan, "g1", "NORMAL", deadline=time.monotonic() + 30)
        expected = {f"{k}-{i}" for k in "xyz" for i in range(300)}
        testing.wait_until(
            lambda: expected <= {str(r["id"]) for r in _records(*records.values())
                                 if r["kind"] == "deliver"}, "every message consumed", 60)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    events = [(float(r["t"]), str(r["kind"]), int(r["queue"]), str(r["member"]))
              for r in _records(*records.values()) if r["kind"] in ("acquire", "release")]
    # m2 was killed: it never wrote its releases; its queues count as held until it died.
    assert overlaps(e for e in events if e[3] != "m2") == []
    m2_last = max((e[0] for e in events if e[3] == "m2"), default=0.0)
    taken = [e for e in events if e[3] != "m2" and e[1] == "acquire" and e[0] < m2_last
             and any(x[2] == e[2] and x[3] == "m2" and x[1] == "acquire" and x[0] <= e[0]
                     for x in events)]
    assert all(
        any(x[2] == e[2] and x[3] == "m2" and x[1] == "release" and x[0] <= e[0] for x in events)
        for e in taken), "a queue of m2 was taken while m2 was alive and holding it"


def test_a_pull_by_a_member_that_does_not_own_the_queue_is_refused(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """A pull or a commit that names a member and a queue it does not own gets NOT_OWNER."""
    _d, plan = cluster
    make_topic(plan, "owned", per_group=1)

    async def run() -> None:
        c = Consumer([addr(plan, "g1-0")], group="cgo", topic="owned", session_timeout_ms=3000)
        try:
            await c.start()
            assert c.assigned == [0, 1]
            req = p.PullRequest("owned", 0, 0, 1000, 0, "cgo", "intruder", 1)
            frame = await request_once(addr(plan, "g1-0"), p.Op.PULL, req.encode())
            assert frame.status == p.Status.NOT_OWNER
            assert "does not own owned/0" in p.error_message(frame)
            # A commit by a member that does not own the queue is refused the same way and
            # stores nothing (the owner's offset stays where it was).
            before = await c.commit()
            commit = p.CommitOffsetRequest("cgo", "owned", {0: 999}, "intruder", 1)
            frame = await request_once(addr(plan, "g1-0"), p.Op.COMMIT_OFFSET, commit.encode())
            assert frame.status == p.Status.NOT_OWNER
            fetch = p.FetchOffsetRequest("cgo", "owned", [0])
            frame = await request_once(addr(plan, "g1-0"), p.Op.FETCH_OFFSET, fetch.encode())
            assert p.OffsetsResponse.decode(frame.body).offsets[0] == before.get(0)
        finally:
            await c.close()

    asyncio.run(run())


def test_members_keep_their_queues_when_their_hosting_broker_dies(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """Both members heartbeat through one broker; it is killed (kill -9). They move to
    another broker, which takes their nodes over in one transaction: nobody rebalances
    their queues away, they never stop pulling, and every message is consumed."""
    directory, plan = cluster
    boot = [addr(plan, "g2-0"), addr(plan, "g1-1"), addr(plan, "g2-1")]
    make_topic(plan, "hosted")
    killed: list[str] = []
    window: list[float] = []  # from the kill to the members' close
    a = Consumer(boot, group="cgh", topic="hosted", session_timeout_ms=4000, max_wait_ms=100)
    b = Consumer(boot, group="cgh", topic="hosted", session_timeout_ms=4000, max_wait_ms=100)
    seen: list[bytes] = []

    async def run() -> None:
        stop = asyncio.Event()
        await a.start()
        await b.start()
        tasks = [asyncio.create_task(drain(c, seen, stop)) for c in (a, b)]
        try:
            await testing.eventually(lambda: len(a.assigned) == 4 and len(b.assigned) == 4,
                                     "4 queues each", 20)
            hosts = {m["broker"] for m in (await describe_consumer_group(boot, "cgh"))["members"]}
            assert len(hosts) == 1
            before = (list(a.assigned), list(b.assigned))
            killed.append(hosts.pop())
            window.append(time.time())
            await asyncio.to_thread(lc.kill, directory, killed[0])
            await produce(boot, "hosted", (b"k-%d" % i for i in range(400)))
            await testing.eventually(lambda: len(set(seen)) >= 400, "400 consumed", 30)
            assert (list(a.assigned), list(b.assigned)) == before
        finally:
            window.append(time.time())
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await a.close()
            await b.close()

    try:
        asyncio.run(run())
    finally:
        for broker in killed:
            lc.start(directory, broker)
            lc.wait_mode(plan, broker.split("-")[0], "NORMAL", deadline=time.monotonic() + 30)
    assert set(seen) >= {b"k-%d" % i for i in range(400)}
    assert overlaps([*log_of(a), *log_of(b)]) == []
    # From the kill until they closed, neither member let go of (or took) a queue.
    moves = [e for e in a.ownership_log + b.ownership_log if window[0] <= e[0] <= window[1]]
    assert moves == []


async def next_member(boot: list[str], cgroup: str, name: str
                      ) -> tuple[dict[str, int | None], list[bytes]]:
    """Where a new member of ``cgroup`` starts on each of the topic's 8 queues (the
    offsets the brokers hold for the group), and what it reads in its first second."""
    c = Consumer(boot, group=cgroup, topic=name, session_timeout_ms=4000)
    try:
        await c.start()
        await testing.eventually(lambda: len(c.started_at) == 8, "8 queues acquired", 20)
        start: dict[str, int | None] = {str(q): o for q, o in sorted(c.started_at.items())}
        return start, [r.body for r in await c.getmany(timeout_s=1.0)]
    finally:
        await c.close()


class Killed:
    """``brokers`` killed (kill -9) on entry; :meth:`restore`, or the end of the ``with``
    block whatever happened in it, starts them again and waits for their groups to be
    NORMAL."""

    def __init__(self, directory: Path, plan: ClusterPlan, *brokers: str) -> None:
        self.directory, self.plan = directory, plan
        self.brokers = brokers
        self.killed: list[str] = []

    def __enter__(self) -> Killed:
        for broker in self.brokers:
            lc.kill(self.directory, broker)
            self.killed.append(broker)
        return self

    def restore(self) -> None:
        groups = sorted({broker.split("-")[0] for broker in self.killed})
        for broker in self.killed:
            lc.start(self.directory, broker)
        self.killed.clear()
        for group in groups:
            lc.wait_mode(self.plan, group, "NORMAL", deadline=time.monotonic() + 30)

    def __exit__(self, *_exc: object) -> None:
        self.restore()


@contextlib.contextmanager
def member_process(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` (an ``understudy consume`` member) with its output in ``log``; killed at the
    end of the ``with`` block if it is still running."""
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_member_process_keeps_consuming_while_a_group_cannot_take_its_commits(
        cluster: tuple[Path, ClusterPlan], tmp_path: Path) -> None:
    """`understudy consume` commits every 50 messages; both brokers of g1 are killed with
    positions on g1's queues not committed yet, so the next commits cannot be taken by g1
    (nobody serves it). The member goes on consuming g2's queues, says what it kept, and
    commits g1's positions once g1 is back: it ends on its count with every message
    consumed and the brokers holding the positions it reports (nothing to read again)."""
    directory, plan = cluster
    boot = [addr(plan, "g2-0"), addr(plan, "g2-1"), addr(plan, "g1-0")]
    make_topic(plan, "patient")
    record, log = tmp_path / "m.jsonl", tmp_path / "m.log"
    cmd = [*UNDERSTUDY, "consume", "-b", ",".join(boot), "-t", "patient", "-g", "cgp",
           "--count", "150", "--idle-timeout", "120", "--commit-every", "50",
           "--session-timeout-ms", "4000", "--member-id", "m", "--record", str(record),
           "--json"]

    def delivered() -> set[str]:
        return {str(r["id"]) for r in _records(record) if r["kind"] == "deliver"}

    with member_process(cmd, log) as proc:
        testing.wait_until(lambda: any(r["kind"] == "acquire" for r in _records(record)),
                           "the member owns queues", 30)
        asyncio.run(produce(boot, "patient", (b"a-%d" % i for i in range(40))))
        testing.wait_until(lambda: len(delivered()) == 40, "40 consumed", 30)
        on_g1 = {q["queue"] for q in asyncio.run(describe_topic(boot, "patient"))["queues"]
                 if q["group"] == "g1"}
        assert any(r["queue"] in on_g1 for r in _records(record) if r["kind"] == "deliver")
        with Killed(directory, plan, "g1-0", "g1-1") as g1:  # g1's positions are not committed (40 < 50)
            asyncio.run(produce(boot[:2], "patient", (b"b-%d" % i for i in range(60))))
            testing.wait_until(lambda: len(delivered()) == 100, "100 consumed", 30)
            # g1 stays down until the commit that carried its positions gave up (its
            # retries last a few seconds; one still running when g1 is back would simply
            # be taken).
            testing.wait_until(lambda: "kept for the next commit" in log.read_text(),
                               "the member to say it kept a commit", 30)
            assert proc.poll() is None, log.read_text()
            g1.restore()
        asyncio.run(produce(boot, "patient", (b"c-%d" % i for i in range(50))))
        assert proc.wait(60) == 0, log.read_text()
    output = log.read_text()
    summary = json.loads(output.strip().splitlines()[-1])
    assert (summary["consumed"], summary["errors"]) == (150, []), summary
    assert summary["commit_failures"] >= 1, output
    assert "kept for the next commit" in output
    assert delivered() == ({f"a-{i}" for i in range(40)} | {f"b-{i}" for i in range(60)}
                           | {f"c-{i}" for i in range(50)})
    # A member starting after it begins at the offsets the brokers hold: the ones
    # reported, with nothing left to read again.
    assert asyncio.run(next_member(boot, "cgp", "patient")) == (summary["positions"], [])


def test_a_producer_and_a_member_started_while_their_brokers_are_down_work_once_they_are_back(
        cluster: tuple[Path, ClusterPlan], tmp_path: Path) -> None:
    """`understudy produce` and `understudy consume` given only g1's brokers, both down:
    the member says it polls again and the producer waits for the topic's route (each
    used to end at once, on its first request); once g1 is back, every message is sent
    (to whichever groups had a writer then) and consumed."""
    directory, plan = cluster
    make_topic(plan, "early")
    g1_only = f"{addr(plan, 'g1-0')},{addr(plan, 'g1-1')}"
    plog, clog = tmp_path / "p.log", tmp_path / "c.log"
    producer_cmd = [*UNDERSTUDY, "produce", "-b", g1_only, "-t", "early", "--count", "30",
                    "--id-prefix", "e", "--send-timeout", "60", "--json"]
    member_cmd = [*UNDERSTUDY, "consume", "-b", g1_only, "-t", "early", "-g", "cge",
                  "--count", "30", "--idle-timeout", "60", "--session-timeout-ms", "4000",
                  "--json"]
    with (Killed(directory, plan, "g1-0", "g1-1") as g1,
          member_process(producer_cmd, plog) as producer,
          member_process(member_cmd, clog) as member):
        testing.wait_until(lambda: clog.read_text().count("polling again in") >= 2,
                           "the member to say it polls again", 30)
        assert producer.poll() is None, plog.read_text()
        assert member.poll() is None, clog.read_text()
        g1.restore()
        assert producer.wait(60) == 0, plog.read_text()
        assert member.wait(60) == 0, clog.read_text()
    sent = json.loads(plog.read_text().strip().splitlines()[-1])
    assert (sent["acked"], sent["failed"], sent["errors"]) == (30, 0, []), sent
    summary = json.loads(clog.read_text().strip().splitlines()[-1])
    assert (summary["consumed"], summary["errors"]) == (30, []), summary
    assert summary["polls_retried"] >= 2, summary
    assert sum(o or 0 for o in summary["positions"].values()) == 30, summary


def ten_on_g1(plan: ClusterPlan, name: str, *, queues: int) -> list[str]:
    """Topic ``name`` on g1 only with ``h-0`` .. ``h-9`` on it; returns a bootstrap of
    the slaves (g1-1, g2-1), which stay up when the masters are killed."""
    boot = [addr(plan, "g1-1"), addr(plan, "g2-1")]
    out = CliRunner().invoke(topic, ["create", "-b", addr(plan, "g1-0"), "-t", name,
                                     "--groups", "g1", "--queues-per-group", str(queues)])
    assert out.exit_code == 0, out.output
    asyncio.run(produce([addr(plan, "g1-0"), *boot], name, (b"h-%d" % i for i in range(10))))
    return boot


def test_a_member_process_that_cannot_hand_a_message_back_commits_nothing_past_it(
        cluster: tuple[Path, ClusterPlan], tmp_path: Path) -> None:
    """`understudy consume --nack-every 1` on a topic of g1 while g1's slave acts and g2's
    master is down: no group can take the handed-back copy, so the nack fails. The
    command ends with the error and commits nothing (closing would have committed past the
    message, and the group would never see it again): the next member reads all of it."""
    directory, plan = cluster
    boot = ten_on_g1(plan, "handback", queues=2)
    cmd = [*UNDERSTUDY, "consume", "-b", ",".join(boot), "-t", "handback", "-g", "cgn",
           "--count", "10", "--nack-every", "1", "--idle-timeout", "30",
           "--session-timeout-ms", "3000", "--json"]
    with Killed(directory, plan, "g1-0", "g2-0"):
        lc.wait_mode(plan, "g1", "SLAVE_CONSUME", deadline=time.monotonic() + 30)
        ended = subprocess.run(cmd, capture_output=True, timeout=120, check=False)
    output = ended.stdout.decode() + ended.stderr.decode()
    assert ended.returncode == 1, output
    summary = json.loads(ended.stdout.decode().strip().splitlines()[-1])
    assert summary["consumed"] >= 1, summary
    assert summary["nacked"] == 0, summary
    assert summary["errors"], summary

    assert sorted(asyncio.run(read_as_new_member(boot, "cgn", "handback", 10))) == sorted(
        b"h-%d" % i for i in range(10))


async def read_as_new_member(boot: list[str], cgroup: str, name: str, count: int) -> list[bytes]:
    """What a new member of ``cgroup`` reads of ``name`` (up to ``count``, 30 s at most)."""
    c = Consumer(boot, group=cgroup, topic=name, session_timeout_ms=3000)
    seen: list[bytes] = []
    try:
        deadline = time.monotonic() + 30
        while len(seen) < count and time.monotonic() < deadline:
            seen.extend(r.body for r in await c.getmany(timeout_s=0.5))
        return seen
    finally:
        await c.close()


def test_a_library_member_that_goes_on_after_a_failed_nack_commits_nothing_past_it(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """A `Consumer` whose nack fails (g1's slave acting, g2's master down: no group can
    take the copy) and that catches the error and goes on: its commits, and close's,
    stop at that record, so the next member reads it again with what followed it on its
    queue. (Before, close() committed past it and the group never saw it again.)"""
    directory, plan = cluster
    boot = ten_on_g1(plan, "handlib", queues=1)

    async def member() -> tuple[list[bytes], list[str]]:
        c = Consumer(boot, group="cgl", topic="handlib", session_timeout_ms=3000)
        seen: list[bytes] = []
        failures: list[str] = []
        try:
            deadline = time.monotonic() + 30
            while len(seen) < 10 and time.monotonic() < deadline:
                for r in await c.getmany(timeout_s=0.5):
                    seen.append(r.body)
                    if r.body == b"h-3":
                        try:
                            await c.nack(r, delay_ms=0)
                        except (BrokerError, ConnectionError) as exc:
                            failures.append(str(exc))  # the application goes on
            await c.commit()
        finally:
            await c.close()
        return seen, failures

    with Killed(directory, plan, "g1-0", "g2-0"):
        lc.wait_mode(plan, "g1", "SLAVE_CONSUME", deadline=time.monotonic() + 30)
        seen, failures = asyncio.run(member())
    assert seen == [b"h-%d" % i for i in range(10)]
    assert failures, "the nack was expected to fail: no group could take the copy"
    assert asyncio.run(read_as_new_member(boot, "cgl", "handlib", 7)) == [
        b"h-%d" % i for i in range(3, 10)]


def _catches_sigterm(pid: int) -> bool:
    """The process has a handler for SIGTERM (``SigCgt`` in /proc): the command's loop
    is running, so a signal now asks it to stop instead of ending it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def test_sigterm_stops_a_producer_still_waiting_for_its_first_route(tmp_path: Path) -> None:
    """`understudy produce` started while no broker answers waits for the route up to its
    send timeout; SIGTERM in that wait ends it at once, with nothing sent and nothing
    failed (it waited out the whole send timeout, then failed)."""
    log = tmp_path / "p.log"
    cmd = [*UNDERSTUDY, "produce", "-b", f"127.0.0.1:{free_port()}", "-t", "nowhere",
           "--count", "10", "--send-timeout", "120", "--json"]
    with member_process(cmd, log) as producer:
        testing.wait_until(lambda: _catches_sigterm(producer.pid), "the produce loop running", 30)
        time.sleep(0.5)  # inside the route's wait
        signalled = time.monotonic()
        producer.send_signal(signal.SIGTERM)
        assert producer.wait(60) == 0, log.read_text()
        waited = time.monotonic() - signalled
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert summary["stopped_by"] == "SIGTERM", summary
    assert (summary["acked"], summary["failed"], summary["errors"]) == (0, 0, []), summary
    assert waited < 60, waited  # the send timeout is 120 s


def test_sigterm_stops_a_producer_and_a_member_process_cleanly(
        cluster: tuple[Path, ClusterPlan], tmp_path: Path) -> None:
    """SIGTERM, what Kubernetes sends a pod it stops: `understudy produce --rate` ends
    with what it sent acknowledged and nothing counted failed; `understudy consume` commits
    what it consumed and leaves the group at once (a crashed member stays listed for its
    30 s session). Both print their summary and exit 0; the next member starts where the
    first one stopped."""
    _directory, plan = cluster
    boot = [addr(plan, "g1-0"), addr(plan, "g2-0")]
    make_topic(plan, "graceful")
    plog, clog, record = tmp_path / "p.log", tmp_path / "c.log", tmp_path / "c.jsonl"
    acks = tmp_path / "p.jsonl"
    produce_cmd = [*UNDERSTUDY, "produce", "-b", ",".join(boot), "-t", "graceful",
                   "--count", "100000", "--rate", "100", "--id-prefix", "s",
                   "--record", str(acks), "--json"]
    with member_process(produce_cmd, plog) as producer:
        testing.wait_until(lambda: acks.exists() and acks.read_text().count("\n") >= 20,
                           "20 messages acknowledged", 30)
        producer.send_signal(signal.SIGTERM)
        assert producer.wait(30) == 0, plog.read_text()
    sent = json.loads(plog.read_text().strip().splitlines()[-1])
    assert sent["stopped_by"] == "SIGTERM", sent
    assert (sent["failed"], sent["errors"]) == (0, []), sent
    assert 20 <= sent["acked"] < 100000, sent
    assert acks.read_text().count("\n") == sent["acked"]

    consume_cmd = [*UNDERSTUDY, "consume", "-b", ",".join(boot), "-t", "graceful", "-g", "cgt",
                   "--count", "100000", "--idle-timeout", "60", "--session-timeout-ms", "30000",
                   "--member-id", "t", "--record", str(record), "--json"]
    with member_process(consume_cmd, clog) as member:
        testing.wait_until(
            lambda: sum(r["kind"] == "deliver" for r in _records(record)) == sent["acked"],
            "every message consumed", 30)
        member.send_signal(signal.SIGTERM)
        assert member.wait(30) == 0, clog.read_text()
    summary = json.loads(clog.read_text().strip().splitlines()[-1])
    assert summary["stopped_by"] == "SIGTERM", summary
    assert (summary["consumed"], summary["errors"]) == (sent["acked"], []), summary
    assert asyncio.run(describe_consumer_group(boot, "cgt"))["members"] == []
    assert asyncio.run(next_member(boot, "cgt", "graceful")) == (summary["positions"], [])
