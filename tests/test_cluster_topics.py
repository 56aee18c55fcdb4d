"""Cluster topics on a real local cluster (ZooKeeper, two groups of broker processes, the
controller): the topic commands and their refusals, routes served by any broker, and a
producer that keeps writing through a master's kill -9 while keyed sends to the dead
group fail clearly and never land elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from understudy_broker import protocol as p
from understudy_broker.admin import describe_topic
from understudy_broker.cli.client import consumer_group, produce, topic
from understudy_broker.client import (
    BrokerError,
    Connection,
    Consumer,
    Producer,
    Router,
    request_once,
)
from understudy_broker.model import Mode, Permission
from understudy_broker.tasks import stop_tasks
from understudy_broker.zkclient import make_client
from understudy_broker.zklayout import (
    BrokerStatus,
    ChainDoc,
    Link,
    OrderedFacts,
    chains_path,
    decode_state,
    ordered_dir,
    state_path,
    status_path,
    topic_path,
)
from understudy_operator.local import cluster as lc
from understudy_operator.local.plan import ClusterPlan

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(two_groups: tuple[Path, ClusterPlan]) -> tuple[Path, ClusterPlan]:
    return two_groups


def address(plan: ClusterPlan, broker: str) -> str:
    return plan.address(broker)


def wait_known(plan: ClusterPlan, topic_name: str) -> None:
    """Until every broker serves ``topic_name`` (the one that took the create answers once
    its own view has it; the others learn it by watch a moment later)."""
    async def known(broker: str) -> bool:
        router = Router([address(plan, broker)])
        try:
            return topic_name in (await router.refresh()).placement
        finally:
            await router.close()

    for broker in (b.name for g in plan.groups for b in g.brokers):
        wait_until(lambda broker=broker: asyncio.run(known(broker)),
                   f"{broker} serving {topic_name}")


def restore_g1(directory: Path, plan: ClusterPlan) -> None:
    """Back to where the next test starts: g1's master running (started if a test killed
    it) and holding READ and WRITE again (a restarted master writes only after its
    back-sync)."""
    with contextlib.suppress(lc.LocalError):  # already running: nothing to start
        lc.start(directory, "g1-0")
    lc.wait_master_holds(plan, "g1", Permission.READ | Permission.WRITE,
                         deadline=time.monotonic() + 30)


def wait_healthy(plan: ClusterPlan) -> None:
    """Until every group is NORMAL with its master holding WRITE and its slave linked: what
    the chain mover calls writable (a test before may have left a group recovering, and
    the mover then rightly moves an ordered topic's head away from it)."""
    zk = make_client(plan.zk_connect, timeout_s=5.0)
    zk.start(timeout=10)

    def healthy(group: str) -> bool:
        state = decode_state(zk.get(state_path(group))[0])
        st = BrokerStatus.from_json(zk.get(status_path(group, f"{group}-0"))[0])
        return (state.mode is Mode.NORMAL and bool(st.effective & Permission.WRITE)
                and bool(st.slave_links))

    try:
        for g in plan.groups:
            wait_until(lambda g=g: healthy(g.group), f"{g.group} healthy", within_s=30)
    finally:
        zk.stop()
        zk.close()


def wait_until(cond: Any, what: str, within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def cli(command: Any, *args: str) -> Any:
    result = CliRunner().invoke(command, list(args), catch_exceptions=False)
    return result


def test_topic_create_places_queues_over_groups_and_any_broker_routes_it(
        cluster: tuple[Path, ClusterPlan]) -> None:
    _d, plan = cluster
    b = address(plan, "g2-1")  # a slave of the other group: still answers
    out = cli(topic, "create", "-b", b, "-t", "orders", "--groups", "g1,g2",
              "--queues-per-group", "2", "--json")
    assert out.exit_code == 0, out.output
    created = json.loads(out.output)
    assert [q["group"] for q in created["queues"]] == ["g1", "g2", "g1", "g2"]

    async def route_from(broker: str) -> p.RouteResponse:
        """The broker's route once it holds the topic: the broker that took the create
        answers only after its own view has it; the others learn it from their ZooKeeper
        watch a moment later."""
        router = Router([address(plan, broker)])
        try:
            deadline = time.monotonic() + 5
            while True:
                route = await router.refresh()
                if "orders" in route.placement or time.monotonic() > deadline:
                    return route
                await asyncio.sleep(0.02)
        finally:
            await router.close()

    for broker in ("g1-0", "g1-1", "g2-0"):
        route = asyncio.run(route_from(broker))
        assert route.placement["orders"] == ["g1", "g2", "g1", "g2"]
        assert {g.group for g in route.groups} >= {"g1", "g2"}

    described = json.loads(cli(topic, "describe", "-b", b, "-t", "orders", "--json").output)
    assert [(q["queue"], q["group"], q["writer"], q["reader"], q["log_end"])
            for q in described["queues"]] == [
        (0, "g1", "g1-0", "g1-0", 0), (1, "g2", "g2-0", "g2-0", 0),
        (2, "g1", "g1-0", "g1-0", 0), (3, "g2", "g2-0", "g2-0", 0)]


def test_bad_topic_requests_are_refused_and_change_nothing(
        cluster: tuple[Path, ClusterPlan]) -> None:
    _d, plan = cluster
    b = address(plan, "g1-0")
    out = CliRunner().invoke(topic, ["create", "-b", b, "-t", "bad", "--groups", "g1,g9"])
    assert out.exit_code != 0
    assert "unknown group 'g9'" in out.output
    out = CliRunner().invoke(topic, ["create", "-b", b, "-t", "bad", "--groups", "g1",
                                     "--queues-per-group", "0"])
    assert out.exit_code == 2  # click refuses the range
    out = CliRunner().invoke(topic, ["describe", "-b", b, "-t", "bad"])
    assert out.exit_code != 0
    assert "unknown topic" in out.output

    assert cli(topic, "create", "-b", b, "-t", "held", "--groups", "g1,g2",
               "--queues-per-group", "1").exit_code == 0
    out = CliRunner().invoke(topic, ["create", "-b", b, "-t", "held", "--groups", "g1"])
    assert out.exit_code != 0
    assert "exists already" in out.output

    async def fill() -> None:
        async with Producer([b]) as prod:
            for i in range(10):
                await prod.send("held", b"m%d" % i, queue=1)  # queue 1 lives on g2

    asyncio.run(fill())
    out = CliRunner().invoke(topic, ["alter", "-b", b, "-t", "held", "--remove-groups", "g2"])
    assert out.exit_code != 0
    assert "still hold messages" in out.output
    after = json.loads(cli(topic, "describe", "-b", b, "-t", "held", "--json").output)
    assert [q["group"] for q in after["queues"]] == ["g1", "g2"]
    out = cli(topic, "alter", "-b", b, "-t", "held", "--remove-groups", "g2", "--force", "--json")
    assert out.exit_code == 0, out.output
    assert [q["group"] for q in json.loads(out.output)["queues"]] == ["g1"]
    grown = json.loads(cli(topic, "alter", "-b", b, "-t", "held", "--add-groups", "g2",
                           "--json").output)
    assert [(q["queue"], q["group"]) for q in grown["queues"]] == [(0, "g1"), (2, "g2")]

    async def misdirected() -> list[tuple[int, str]]:
        asks = [(p.Op.PULL, p.PullRequest("held", 2, 0, 1000, 0).encode()),
                (p.Op.PRODUCE, p.encode_produce("held", [(2, None, b"x")])),
                (p.Op.COMMIT_OFFSET, p.CommitOffsetRequest("cg", "held", {2: 1}).encode()),
                (p.Op.PULL, p.PullRequest("held", 1, 0, 1000, 0).encode())]
        out = []
        for op, body in asks:
            frame = await request_once(b, op, body)
            out.append((frame.status, p.error_message(frame)))
        return out

    answers = asyncio.run(misdirected())
    assert [a[0] for a in answers] == [p.Status.BAD_REQUEST] * 4
    assert "queue 2 of topic 'held' lives on group 'g2', not on 'g1'" in answers[0][1]
    assert "queue 1 of topic 'held' was removed" in answers[3][1]


def test_writes_continue_through_a_master_kill_and_keyed_sends_stay_put(
        cluster: tuple[Path, ClusterPlan]) -> None:
    directory, plan = cluster
    boot = [address(plan, "g2-0"), address(plan, "g1-1")]
    assert cli(topic, "create", "-b", boot[0], "-t", "stream", "--groups", "g1,g2",
               "--queues-per-group", "2").exit_code == 0
    # A key that hashes to a queue on g1 (queues 0 and 2), for the keyed send.
    key = next(k for k in (b"k%d" % i for i in range(100)) if [0, 1, 2, 3][zlib.crc32(k) % 4] in (0, 2))

    async def run() -> tuple[set[bytes], list[float], BaseException | None, set[bytes]]:
        acked: set[bytes] = set()
        ack_times: list[float] = []
        async with Producer(boot, linger_ms=1, send_timeout_s=3.0, retry_backoff_ms=20) as prod:
            async def one(i: int) -> None:
                body = b"s-%d" % i
                try:
                    fut = await prod.send("stream", body)
                    await fut
                except (BrokerError, ConnectionError):
                    return
                acked.add(body)
                ack_times.append(time.monotonic())

            pending: list[asyncio.Task[None]] = []
            killed_at = 0.0
            keyed_error: BaseException | None = None
            for i in range(600):
                pending.append(asyncio.create_task(one(i)))
                await asyncio.sleep(0.005)
                if i == 200:
                    await asyncio.to_thread(lc.kill, directory, "g1-0")
                    killed_at = time.monotonic()
                if i == 300:
                    fut = await prod.send("stream", b"keyed", key=key)
                    try:
                        await fut
                    except BrokerError as exc:
                        keyed_error = exc
            await asyncio.gather(*pending)
            after_kill = [t for t in ack_times if t > killed_at]
            assert after_kill, "no send was acknowledged after the kill"

        consumed: set[bytes] = set()
        c = Consumer(boot, group="audit", topic="stream", max_wait_ms=200)
        try:
            deadline = time.monotonic() + 60
            while not acked <= consumed and time.monotonic() < deadline:
                for r in await c.getmany(timeout_s=1):
                    consumed.add(r.body)
        finally:
            await c.close()
        return acked, ack_times, keyed_error, consumed

    try:
        acked, _times, keyed_error, consumed = asyncio.run(run())
    finally:
        lc.start(directory, "g1-0")
        # Back to where the next test starts: a restarted master is isolated until its
        # back-sync, so it writes again only a moment after its process is up.
        lc.wait_master_holds(plan, "g1", Permission.READ | Permission.WRITE,
                             deadline=time.monotonic() + 30)
    assert len(acked) > 500, f"only {len(acked)} of 600 unkeyed sends were acknowledged"
    assert acked <= consumed, f"{len(acked - consumed)} acknowledged messages lost"
    assert isinstance(keyed_error, BrokerError)
    assert "on group 'g1', which has no writer" in str(keyed_error)
    assert b"keyed" not in consumed  # it never landed on another group


def test_consumer_group_describe_answers_for_an_unknown_group(
        cluster: tuple[Path, ClusterPlan]) -> None:
    _d, plan = cluster
    out = cli(consumer_group, "describe", "-b", address(plan, "g1-1"), "-g", "nobody", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {"group": "nobody", "generation": 0, "members": [],
                                      "assignment": []}



def test_produce_cli_paces_with_rate_and_reports_the_write_stall(
        cluster: tuple[Path, ClusterPlan]) -> None:
    _d, plan = cluster
    b = address(plan, "g2-0")
    assert cli(topic, "create", "-b", b, "-t", "paced", "--groups", "g1,g2",
               "--queues-per-group", "1").exit_code == 0
    out = cli(produce, "-b", b, "-t", "paced", "--count", "300", "--size", "64",
              "--rate", "1000", "--json")
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output.strip().splitlines()[-1])
    assert summary["acked"] == 300
    assert summary["failed"] == 0
    assert summary["seconds"] >= 0.29  # 300 messages at 1000/s take at least 0.3 s
    assert 0 < summary["max_ack_gap_ms"] < 5000


def test_writes_continue_while_a_master_hangs(cluster: tuple[Path, ClusterPlan]) -> None:
    """SIGSTOP of g2's master mid-stream: unkeyed sends move to g1 (the unanswered batches
    are copied there after hedge_after_ms) and keep being acknowledged during the hang;
    after SIGCONT every acknowledged message is consumed."""
    directory, plan = cluster
    for group in ("g1", "g2"):  # the premise: both masters take writes before the hang
        lc.wait_master_holds(plan, group, Permission.WRITE, deadline=time.monotonic() + 30)
    boot = [address(plan, "g1-0"), address(plan, "g2-1")]
    assert cli(topic, "create", "-b", boot[0], "-t", "hung", "--groups", "g1,g2",
               "--queues-per-group", "2").exit_code == 0

    async def run() -> tuple[set[bytes], int, set[bytes]]:
        acked: set[bytes] = set()
        during = 0
        stopped = False
        async with Producer(boot, send_timeout_s=5.0, hedge_after_ms=300) as prod:
            async def one(i: int) -> None:
                nonlocal during
                body = b"h-%d" % i
                with contextlib.suppress(BrokerError, ConnectionError):
                    await (await prod.send("hung", body))
                    acked.add(body)
                    if stopped:
                        during += 1

            tasks = []
            try:
                for i in range(500):
                    tasks.append(asyncio.create_task(one(i)))
                    await asyncio.sleep(0.005)
                    if i == 150:
                        await asyncio.to_thread(lc.kill, directory, "g2-0", sig="STOP")
                        stopped = True
                await asyncio.sleep(0.5)
                ack_during = during
            finally:
                stopped = False
                await asyncio.to_thread(lc.start, directory, "g2-0")  # SIGCONT
            await asyncio.gather(*tasks)
        consumed: set[bytes] = set()
        c = Consumer(boot, group="audit", topic="hung", max_wait_ms=200)
        try:
            deadline = time.monotonic() + 60
            while not acked <= consumed and time.monotonic() < deadline:
                consumed |= {r.body for r in await c.getmany(timeout_s=1)}
        finally:
            await c.close()
        return acked, ack_during, consumed

    acked, ack_during, consumed = asyncio.run(run())
    assert ack_during > 200, f"only {ack_during} sends were acknowledged during the hang"
    assert acked <= consumed, f"{len(acked - consumed)} acknowledged messages lost"


def test_an_ordered_topic_is_created_with_its_chains_and_deleted_with_them(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """`topic create --ordered` writes the topic and its initial chains in one ZooKeeper
    transaction (docs/ordered.md); more than one queue per group is refused and changes
    nothing; a delete takes the chains with it."""
    _d, plan = cluster
    b = address(plan, "g1-1")
    wait_healthy(plan)
    zk = make_client(plan.zk_connect, timeout_s=5.0)
    zk.start(timeout=10)
    try:
        out = CliRunner().invoke(topic, ["create", "-b", b, "-t", "ledger", "--groups", "g1,g2",
                                         "--queues-per-group", "4", "--ordered"])
        assert out.exit_code != 0
        assert "one queue per group" in out.output
        assert zk.exists(topic_path("ledger")) is None
        assert zk.exists(chains_path("ledger")) is None

        out = cli(topic, "create", "-b", b, "-t", "ledger", "--groups", "g2,g1", "--ordered",
                  "--json")
        assert out.exit_code == 0, out.output
        created = json.loads(out.output)
        assert [q["group"] for q in created["queues"]] == ["g2", "g1"]
        wait_known(plan, "ledger")
        raw, _stat = zk.get(chains_path("ledger"))
        chains = ChainDoc.from_json(raw).check(("g1", "g2"))
        assert chains.send == ("g2", "g1")  # the first group is the send head
        assert chains.consume_groups() == ("g2",)

        # The send head's reader publishes what the chain mover needs: the log end of the
        # topic's queue there, how far the consumer groups got, the chain epoch applied.
        def facts() -> OrderedFacts | None:
            raw, _ = zk.get(status_path("g2", "g2-0"))
            return BrokerStatus.from_json(raw).ordered.get("ledger")

        async def send_three() -> None:
            async with Producer([b]) as prod:
                for i in range(3):
                    await (await prod.send("ledger", b"o%d" % i, queue=0))  # queue 0: g2

        asyncio.run(send_three())
        wait_until(lambda: facts() == OrderedFacts(end=3, consumed=3, view_epoch=1),
                   "g2-0 publishing end 3 (no consumer group yet: nothing held)")

        async def commit_one() -> None:
            conn = await Connection.open(address(plan, "g2-0"))
            try:
                await conn.request(p.Op.COMMIT_OFFSET,
                                   p.CommitOffsetRequest("audit", "ledger", {0: 1}).encode())
            finally:
                await conn.close()

        asyncio.run(commit_one())
        wait_until(lambda: facts() == OrderedFacts(end=3, consumed=1, view_epoch=1,
                                                   groups=("audit",)),
                   "g2-0 publishing the consumer group's offset")

        out = CliRunner().invoke(topic, ["alter", "-b", b, "-t", "ledger",
                                         "--remove-groups", "g1", "--force"])
        assert out.exit_code != 0
        assert "ordered" in out.output
        assert cli(topic, "delete", "-b", b, "-t", "ledger", "--force").exit_code == 0
        assert zk.exists(topic_path("ledger")) is None
        assert zk.exists(ordered_dir("ledger")) is None
    finally:
        zk.stop()
        zk.close()


def test_the_controller_moves_an_ordered_topics_chains_through_a_master_kill(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """docs/ordered.md's worked example on real processes: the send head's master is
    killed, so the next group becomes head and the consume tail in one write; the old head
    stays in the consume chain until the consumer group has read it to its end (through
    its acting slave); its restarted master rejoins the send chain's tail."""
    directory, plan = cluster
    b = address(plan, "g2-0")
    wait_healthy(plan)
    zk = make_client(plan.zk_connect, timeout_s=5.0)
    zk.start(timeout=10)
    seen: list[tuple[tuple[str, ...], tuple[Link, ...]]] = []

    def chains() -> ChainDoc:
        doc = ChainDoc.from_json(zk.get(chains_path("chained"))[0]).check(("g1", "g2"))
        if not seen or seen[-1] != (doc.send, doc.consume):
            seen.append((doc.send, doc.consume))
        return doc

    async def commit(broker: str, offset: int) -> None:
        conn = await Connection.open(address(plan, broker))
        try:
            frame = await conn.request(p.Op.COMMIT_OFFSET, p.CommitOffsetRequest(
                "replay", "chained", {0: offset}).encode())
            assert p.OffsetsResponse.decode(frame).offsets[0] == offset
        finally:
            await conn.close()

    async def send(n: int) -> list[int]:
        """Unkeyed sends: an ordered topic's go to the send head's queue, all of them."""
        async with Producer([b]) as prod:
            return [(await (await prod.send("chained", b"c%d" % i)))[0] for i in range(n)]

    try:
        assert cli(topic, "create", "-b", b, "-t", "chained", "--groups", "g1,g2",
                   "--ordered").exit_code == 0
        wait_known(plan, "chained")
        assert asyncio.run(send(3)) == [0, 0, 0]  # queue 0 is g1's: the head
        asyncio.run(commit("g1-0", 1))  # the consumer group read one of g1's three
        wait_until(lambda: chains().consume == (Link("g1"),), "the initial chains")

        lc.kill(directory, "g1-0")
        wait_until(lambda: chains().send == ("g2",), "g2 as the send head")
        moved = chains()
        assert moved.consume == (Link("g1", moved.head_epoch), Link("g2"))
        assert asyncio.run(send(2)) == [1, 1]  # g2's queue now
        time.sleep(1.0)  # g1 still holds two unread messages: it must stay
        assert chains().consume_groups() == ("g1", "g2")

        async def read_to_the_end() -> None:
            # Another consumer group subscribes and commits nothing: it holds g1 too.
            late = Consumer([b], group="late", topic="chained", max_wait_ms=100)
            await late.start()
            try:
                await commit("g1-1", 3)  # "replay" read g1 to its end (the acting slave)
                await asyncio.sleep(1.0)
                assert chains().consume_groups() == ("g1", "g2")  # "late" has read nothing
            finally:
                await late.abort()  # crashes: its member goes once its session ends
            leave = Consumer([b], group="late", topic="chained", max_wait_ms=100,
                             session_timeout_ms=1000)
            await leave.start()
            await leave.close()  # joins and leaves cleanly, committing nothing

        asyncio.run(read_to_the_end())
        wait_until(lambda: chains().consume == (Link("g2"),), "g1 drained and gone",
                   within_s=20)

        lc.start(directory, "g1-0")
        lc.wait_master_holds(plan, "g1", Permission.READ | Permission.WRITE,
                             deadline=time.monotonic() + 30)
        wait_until(lambda: chains().send == ("g2", "g1"), "g1 back at the send tail")
        # g1 is writable again but waits in the send chain: it refuses the topic's writes.
        refused = asyncio.run(request_once(address(plan, "g1-0"), p.Op.PRODUCE,
                                           p.encode_produce("chained", [(0, None, b"x")])))
        assert refused.status == p.Status.NOT_SEND_HEAD
        assert "its send head is g2, not 'g1'" in p.error_message(refused)
        assert asyncio.run(send(1)) == [1]
        epoch = chains().head_epoch
        assert seen == [
            (("g1", "g2"), (Link("g1"),)),
            (("g2",), (Link("g1", epoch), Link("g2"))),
            (("g2",), (Link("g2"),)),
            (("g2", "g1"), (Link("g2"),)),
        ]
    finally:
        with contextlib.suppress(lc.LocalError):  # already running: nothing to restore
            lc.start(directory, "g1-0")
            lc.wait_master_holds(plan, "g1", Permission.READ | Permission.WRITE,
                                 deadline=time.monotonic() + 30)
        zk.stop()
        zk.close()


def test_an_ordered_topic_is_consumed_in_order_through_its_send_heads_death(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """Invariant 7 end to end, through a master's kill -9: a member of the consumer group
    reads the old head's rest (through its acting slave) before anything the new head took,
    and two members never read the topic at once (one owns it)."""
    directory, plan = cluster
    boot = [address(plan, "g2-0"), address(plan, "g1-1")]
    wait_healthy(plan)

    async def run() -> tuple[list[bytes], list[list[int]]]:
        async with Producer(boot) as prod:
            async def send(*bodies: bytes) -> list[int]:
                return [(await (await prod.send("inorder", body)))[0] for body in bodies]

            a = Consumer(boot, group="replay", topic="inorder", max_wait_ms=100)
            b = Consumer(boot, group="replay", topic="inorder", max_wait_ms=100)
            got: list[bytes] = []
            try:
                await a.start()
                await b.start()
                assert await send(b"m0") == [0]
                while len(got) < 1:
                    got += [r.body for c in (a, b) for r in await c.getmany(timeout_s=0.2)]
                for c in (a, b):
                    await c.commit()
                assert await send(b"m1", b"m2") == [0, 0]
                lc.kill(directory, "g1-0")
                deadline = time.monotonic() + 20
                sent: list[int] = []
                while not sent and time.monotonic() < deadline:  # until g2 is the head
                    with contextlib.suppress(BrokerError):
                        sent = await send(b"m3")
                sent += await send(b"m4", b"m5")
                while len(got) < 6 and time.monotonic() < deadline:
                    for c in (a, b):
                        batch = await c.getmany(timeout_s=0.2)
                        got += [r.body for r in batch]
                        if batch:
                            await c.commit()
                return got, [a.assigned, b.assigned, [sent[0]]]
            finally:
                await a.close()
                await b.close()

    try:
        assert cli(topic, "create", "-b", boot[0], "-t", "inorder", "--groups", "g1,g2",
                   "--ordered").exit_code == 0
        wait_known(plan, "inorder")
        got, (_a, _b, first_on_g2) = asyncio.run(run())
    finally:
        restore_g1(directory, plan)
    assert first_on_g2 == [1]  # m3 went to the new head, g2's queue
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]


def test_a_pipelining_producer_keeps_an_ordered_topics_order_through_a_kill(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """Sends made without waiting for each acknowledgement: one batch of the ordered topic
    is in flight at a time, and the batch the dead head never acknowledged is re-sent whole
    to the next head before any later one. The consumer group receives every acknowledged
    id, first deliveries in acknowledgement order (a copy the old head kept is a duplicate,
    read before, never out of order)."""
    directory, plan = cluster
    wait_healthy(plan)
    boot = [address(plan, "g2-0"), address(plan, "g1-1")]

    async def run() -> tuple[list[int], list[int], int]:
        acked: list[int] = []
        got: list[int] = []
        done = asyncio.Event()

        def on_ack(i: int, f: asyncio.Future[tuple[int, int]]) -> None:
            if not f.cancelled() and f.exception() is None:
                acked.append(i)

        commit_errors: list[str] = []

        async def consume(c: Consumer) -> None:
            # Reading while the producer sends, as a replaying consumer does: its commits
            # are what hold a group in the consume chain until it has read it.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (done.is_set()
                                                       and set(acked) <= set(got)):
                batch = await c.getmany(timeout_s=0.2)
                got.extend(int(r.body) for r in batch)
                if batch:
                    try:
                        await c.commit()
                    except BrokerError as exc:  # as an application does: the next one retries
                        if not exc.retriable:
                            raise
                        commit_errors.append(str(exc))
                        print(f"commit refused, retried with the next batch: {exc}")

        c = Consumer(boot, group="pipe", topic="piped", max_wait_ms=100)
        await c.start()
        reader = asyncio.create_task(consume(c))
        try:
            async with Producer(boot, linger_ms=2, send_timeout_s=20.0) as prod:
                futures = []
                for i in range(300):
                    fut = await prod.send("piped", b"%d" % i)
                    fut.add_done_callback(functools.partial(on_ack, i))
                    futures.append(fut)
                    await asyncio.sleep(0.002)
                    if i == 100:
                        await asyncio.to_thread(lc.kill, directory, "g1-0")
                await asyncio.gather(*futures, return_exceptions=True)
            done.set()
            await reader
        finally:
            await stop_tasks([reader])
            await c.close()
        return acked, got, len(futures)

    try:
        assert cli(topic, "create", "-b", boot[0], "-t", "piped", "--groups", "g1,g2",
                   "--ordered").exit_code == 0
        wait_known(plan, "piped")
        acked, got, sent = asyncio.run(run())
    finally:
        restore_g1(directory, plan)
    assert sent == 300
    assert acked == sorted(acked), "acknowledgements came out of send order"
    assert len(acked) > 250, f"only {len(acked)} of 300 acknowledged"
    first = list(dict.fromkeys(got))  # duplicates dropped: each id at its first delivery
    assert set(acked) <= set(first), f"{len(set(acked) - set(first))} acknowledged ids lost"
    assert first == sorted(first), "an id was delivered before one acknowledged earlier"


def test_one_producer_of_an_ordered_topic_sends_and_a_paused_former_one_is_refused(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """Producer leadership held by the brokers (docs/ordered.md): of two producers of an
    ordered topic one sends and the other's sends wait; when the active one crashes the
    other takes over after its session, and a send under the crashed one's lease (a
    former leader woken from a pause) is refused with NOT_OWNER, as is a send with no
    lease. A producer that closes hands the leadership on at once."""
    _directory, plan = cluster
    boot = [address(plan, "g1-1"), address(plan, "g2-1")]
    wait_healthy(plan)

    async def send_head() -> tuple[str, int]:
        router = Router(boot)
        try:
            await router.refresh()
            _ordered, head = router.send_head("solo")
            queue = router.queue_on("solo", head)
            assert head is not None
            assert queue is not None
            return address(plan, f"{head}-0"), queue
        finally:
            await router.close()

    async def produce_raw(lease: p.ProduceLease | None) -> p.Frame:
        head, queue = await send_head()
        return await request_once(head, p.Op.PRODUCE,
                                  p.encode_produce("solo", [(queue, None, b"late")], lease))

    async def run() -> dict[str, Any]:
        first = Producer(boot, leader_session_timeout_ms=1500)
        second = Producer(boot, leader_session_timeout_ms=1500)
        try:
            assert (await (await first.send("solo", b"a0")))[1] == 0
            old_lease = first.leadership("solo").lease
            waiting = await second.send("solo", b"b0")
            await asyncio.sleep(1.0)  # the second stands by: its send waits
            standby_waited = not waiting.done() and not second.leadership("solo").active
            crashed_at = time.monotonic()
            await first.abort()
            async with asyncio.timeout(10):
                await waiting
            took_over_s = time.monotonic() - crashed_at
            late = await produce_raw(old_lease)
            bare = await produce_raw(None)
            described = await describe_topic(boot, "solo")
            third = Producer(boot, leader_session_timeout_ms=1500)
            try:
                waiting3 = await third.send("solo", b"c0")
                await asyncio.sleep(0.3)
                third_waited = not waiting3.done()
                handed_at = time.monotonic()
                await second.close()  # leaves: the third takes over at once
                async with asyncio.timeout(10):
                    await waiting3
                handed_s = time.monotonic() - handed_at
            finally:
                await third.close()
            return {"standby_waited": standby_waited, "took_over_s": took_over_s,
                    "late": (late.status, p.error_message(late)), "bare": bare.status,
                    "third_waited": third_waited,
                    "handed_s": handed_s, "described": described,
                    "second": second.leadership("solo").member_id,
                    "first": first.leadership("solo").member_id}
        finally:
            await first.abort()
            await second.close()

    assert cli(topic, "create", "-b", boot[0], "-t", "solo", "--groups", "g1,g2",
               "--ordered").exit_code == 0
    wait_known(plan, "solo")
    out = asyncio.run(run())
    assert out["standby_waited"]
    status, message = out["late"]
    assert status == p.Status.NOT_OWNER
    assert "does not own solo" in message
    assert out["bare"] == p.Status.NOT_OWNER
    assert out["third_waited"]
    # The crashed leader's session (1.5 s) had to end first; a clean leave hands on at once.
    assert out["took_over_s"] >= 1.0
    assert out["handed_s"] < out["took_over_s"]
    # `topic describe` shows who sends: the second, the crashed first gone from the group.
    prods = out["described"]["producers"]
    assert prods["active"] == out["second"]
    assert out["first"] not in prods["members"]
    assert out["described"]["send_head"] in ("g1", "g2")
    assert out["described"]["consume_head"] is not None


def test_an_orderly_consumer_reads_one_record_at_a_time_through_a_masters_death(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """Orderly consumption on an ordinary topic (docs/ordered.md): the queue owner gets one
    record at a time, in queue order, and the record before is committed when it asks for
    the next. Ownership and commits live with the brokers, so through g1's master kill -9
    it keeps reading g1's queue through the acting slave, and when it crashes the next
    owner starts at the one record it had not come back from (nothing earlier again)."""
    directory, plan = cluster
    boot = [address(plan, "g1-1"), address(plan, "g2-1")]
    wait_healthy(plan)

    per_queue = 20  # more than the 16 read: the next owner has some left on each queue
    last_queue: list[int] = []
    seen_now: dict[int, list[int]] = {}

    def expected() -> dict[int, int]:
        """Where the next owner starts: again at the record handed out last (never come
        back from, so not committed); on the other queue right after its last record."""
        out = {q: offsets[-1] + (q not in last_queue) if offsets else 0
               for q, offsets in seen_now.items()}
        return {q: o for q, o in out.items() if o < per_queue}

    async def run() -> tuple[list[int], dict[int, list[int]], dict[int, int]]:
        async with Producer(boot) as prod:
            for i in range(2 * per_queue):
                await (await prod.send("orderly", b"%d" % i, queue=i % 2))
        a = Consumer(boot, group="orderly", topic="orderly", orderly=True, max_wait_ms=100,
                     session_timeout_ms=1500)
        sizes: list[int] = []
        seen = seen_now
        seen.update({0: [], 1: []})
        try:
            await a.start()
            while sum(map(len, seen.values())) < 6:
                batch = await a.getmany(timeout_s=0.5)
                sizes.append(len(batch))
                for r in batch:
                    seen[r.queue].append(r.offset)
            lc.kill(directory, "g1-0")
            deadline = time.monotonic() + 20
            while sum(map(len, seen.values())) < 16 and time.monotonic() < deadline:
                batch = await a.getmany(timeout_s=0.5)
                sizes.append(len(batch))
                for r in batch:
                    seen[r.queue].append(r.offset)
                    last_queue[:] = [r.queue]
        finally:
            await a.abort()  # a crash: the last record handed out was not processed
        b = Consumer(boot, group="orderly", topic="orderly", orderly=True, max_wait_ms=100,
                     session_timeout_ms=1500)
        first: dict[int, int] = {}
        try:
            await b.start()
            deadline = time.monotonic() + 20
            while len(first) < len(expected()) and time.monotonic() < deadline:
                for r in await b.getmany(timeout_s=0.5):
                    first.setdefault(r.queue, r.offset)
        finally:
            await b.close()
        return sizes, seen, first

    try:
        assert cli(topic, "create", "-b", boot[0], "-t", "orderly", "--groups", "g1,g2",
                   "--queues-per-group", "1").exit_code == 0
        wait_known(plan, "orderly")
        sizes, seen, first = asyncio.run(run())
    finally:
        restore_g1(directory, plan)
    assert max(sizes) == 1
    assert sum(map(len, seen.values())) >= 16
    for q, offsets in seen.items():
        assert offsets == list(range(len(offsets))), (q, offsets)  # in order, none twice
    assert first == expected(), (first, seen, last_queue)
    assert len(first) == 2


def test_a_head_master_woken_from_a_pause_takes_no_ordered_write(
        cluster: tuple[Path, ClusterPlan]) -> None:
    """Found by bench/ordered.py: a master woken from SIGSTOP still holds WRITE until the
    new group state reaches it, and its chain document is as stale; it took ordered writes
    after the chains had moved on. Now it takes them only while ZooKeeper confirmed its view
    within the lease (docs/ordered.md "Fencing the send head"): a write from the active
    producer, waiting in its socket when it is continued, is refused before the append,
    and the new head takes the next one."""
    directory, plan = cluster
    boot = [address(plan, "g2-1"), address(plan, "g1-1")]
    wait_healthy(plan)

    async def run() -> tuple[p.Frame, list[int]]:
        async with Producer(boot, leader_session_timeout_ms=6000) as prod:
            assert (await (await prod.send("woken", b"w0")))[0] == 0  # g1 is head
            lease = prod.leadership("woken").lease
            lc.kill(directory, "g1-0", sig="STOP")
            conn: Connection | None = None
            try:
                # Past the session: the controller fences g1 and the chains move to g2.
                await asyncio.sleep(plan.session_timeout_ms / 1000 + 1.5)
                # Connected and sent while it is stopped (the kernel accepts): the request
                # is the first thing it reads when it wakes, as a producer's in flight is.
                conn = await Connection.open(address(plan, "g1-0"))
                pending = conn.send(p.Op.PRODUCE,
                                    p.encode_produce("woken", [(0, None, b"late")], lease))
            finally:
                lc.kill(directory, "g1-0", sig="CONT")
            try:
                async with asyncio.timeout(10):
                    late = await pending
            finally:
                await conn.close()
            after = [(await (await prod.send("woken", b"w%d" % i)))[0] for i in (1, 2)]
            return late, after

    try:
        assert cli(topic, "create", "-b", boot[0], "-t", "woken", "--groups", "g1,g2",
                   "--ordered").exit_code == 0
        wait_known(plan, "woken")
        late, after = asyncio.run(run())
    finally:
        restore_g1(directory, plan)
    # Refused before the append (nothing of it stored on the old head): without the lease
    # check it was appended, and acknowledged or answered NOT_ENOUGH_REPLICAS depending on
    # whether the slave had relinked yet.
    assert late.status in (p.Status.NOT_SEND_HEAD, p.Status.NO_PERMISSION), (
        late.status, p.error_message(late) if late.status else "acknowledged")
    assert after == [1, 1]  # g2's queue: the new head
