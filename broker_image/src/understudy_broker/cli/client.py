"""``understudy produce``, ``understudy consume`` and ``understudy topic``.

Why this module exists: people, runbooks, the demo and the drill drive the broker from a
shell. These commands wrap :mod:`understudy_broker.client`, show live progress on
stderr, and with ``--json`` end stdout with exactly one JSON object that scripts parse
(``acked``/``consumed`` and ``msgs_per_s`` at least).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from understudy_broker import protocol as p
from understudy_broker.admin import (
    admin_topic,
    describe_consumer_group,
    describe_topic,
    list_consumer_groups,
)
from understudy_broker.client import (
    DEFAULT_LINGER_MS,
    BrokerError,
    Consumer,
    Producer,
    Router,
    create_topic,
)
from understudy_broker.faultavoid import DEFAULT_STEPS, parse_steps
from understudy_broker.model import parse_address_list
from understudy_broker.retry import Backoff
from understudy_broker.scheduling import (
    DEFAULT_MAX_RECONSUME,
    DLQ_PREFIX,
    ScheduleError,
    check_deliver_at,
    parse_deliver_at_ms,
    parse_duration_ms,
)
from understudy_broker.security import PASSWORD_ENV, ClientSecurity, SecurityConfigError
from understudy_broker.tasks import stop_tasks

_stderr = Console(stderr=True)


def _bootstrap(values: Sequence[str]) -> list[str]:
    try:
        return parse_address_list(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--bootstrap") from None


class Stop:
    """The first SIGTERM or SIGINT a command's loop took: it ends as at its count (the
    producer flushes, the consumer commits and leaves) and prints its summary."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.signal: str | None = None

    @property
    def requested(self) -> bool:
        return self.event.is_set()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Stop]:
    """SIGTERM (what Kubernetes and ``kill`` send) and SIGINT (Ctrl-C) ask the running
    command to stop cleanly; after the first one, a second acts as it would without this
    (SIGTERM ends the process at once, SIGINT raises KeyboardInterrupt). Call inside the
    event loop; outside the main thread (no signals there) it installs nothing."""
    loop = asyncio.get_running_loop()
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    sigs = (signal.SIGTERM, signal.SIGINT)

    def caught(sig: signal.Signals) -> None:
        stop.signal = sig.name
        stop.event.set()
        for s in sigs:
            loop.remove_signal_handler(s)
        _stderr.print(f"{sig.name}: stopping (again to stop at once)", markup=False, highlight=False)

    for sig in sigs:
        loop.add_signal_handler(sig, caught, sig)
    try:
        yield stop
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


async def _sleep_unless(stop: Stop, delay_s: float) -> None:
    """Sleep ``delay_s``, or less if a stop is asked for meanwhile."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay_s):
            await stop.event.wait()


T = TypeVar("T")


async def _unless_stopped(stop: Stop, aw: Awaitable[T]) -> T | None:
    """``aw``'s result, or ``None`` when a stop is asked for first; ``aw`` is then
    cancelled, so use it only for a wait that is safe to give up (a topic's route)."""
    task = asyncio.ensure_future(aw)
    stopped = asyncio.ensure_future(stop.event.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # this coroutine itself was cancelled, not only ``aw``
        return None


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=_stderr,
        transient=False,
    )


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[max(0, int(q * 1000) - 1)]


bootstrap_option = click.option(
    "--bootstrap",
    "-b",
    multiple=True,
    required=True,
    metavar="HOST:PORT",
    help="Any broker of the group (repeatable or comma-separated).",
)

F = TypeVar("F", bound=Callable[..., Any])

#: How long ``consume`` waits for a commit on its way (after that the commit goes on in
#: the background and the group is skipped while it does: :meth:`Consumer.commit`).
COMMIT_WAIT_S = 1.0

_SECURITY_OPTIONS = (
    click.option("--tls-ca", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                 envvar="UNDERSTUDY_TLS_CA",
                 help="Connect over TLS, verifying brokers against these CA certificates."),
    click.option("--tls-cert", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                 help="Client certificate (its common name is the user; with --tls-key)."),
    click.option("--tls-key", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                 help="The client certificate's private key."),
    click.option("--user", default=None, metavar="NAME", envvar="UNDERSTUDY_USER",
                 help="Authenticate as this user (SCRAM-SHA-512)."),
    click.option("--password-file", type=click.Path(dir_okay=False), default=None,
                 metavar="FILE",
                 help=f"The user's password (else the {PASSWORD_ENV} environment variable)."),
)


def client_options(fn: F) -> F:
    """``--bootstrap`` and the security flags; the command receives ``bootstrap`` and
    ``security`` (a :class:`ClientSecurity`, or None without any security flag)."""
    return bootstrap_option(security_options(fn))


def security_options(fn: F) -> F:
    """The security flags alone (a command with its own ``--bootstrap``): the command
    receives ``security``."""
    @functools.wraps(fn)
    def wrapper(*args: Any, tls_ca: str | None, tls_cert: str | None, tls_key: str | None,
                user: str | None, password_file: str | None, **kwargs: Any) -> Any:
        def path(v: str | None) -> Path | None:
            return None if v is None else Path(v)
        try:
            kwargs["security"] = ClientSecurity.from_files(
                tls_ca=path(tls_ca), tls_cert=path(tls_cert), tls_key=path(tls_key),
                user=user, password_file=path(password_file))
        except SecurityConfigError as exc:
            raise click.UsageError(str(exc)) from None
        return fn(*args, **kwargs)

    out: Any = wrapper
    for option in reversed(_SECURITY_OPTIONS):
        out = option(out)
    return out  # type: ignore[no-any-return]


@click.command(short_help="Produce messages to a topic.",
               context_settings={"help_option_names": ["-h", "--help"]})
@client_options
@click.option("--topic", "-t", required=True)
@click.option("--count", "-n", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option("--size", "-s", type=click.IntRange(min=1), default=1024, show_default=True, help="Body bytes per message.")
@click.option("--window", type=click.IntRange(min=1), default=256, show_default=True, help="Messages in flight (unacknowledged) at most.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--linger-ms", type=click.FloatRange(min=0), default=DEFAULT_LINGER_MS,
              show_default=True,
              help="Wait this long after a batch's first message for more (fewer, larger "
                   "requests: less CPU on brokers and client at moderate rates).")
@click.option("--key", default=None, help="Message key (all messages; picks the queue by hash).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="MSGS_PER_S", help="Send at this rate instead of as fast as possible.")
@click.option("--retries", type=click.IntRange(min=0), default=5, show_default=True,
              help="Times a failed unkeyed send moves to another group.")
@click.option("--send-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds before a send fails (keyed: its queue's group has no writer; "
                   "the first: no broker answers for the topic's route).")
@click.option("--fault-avoidance/--no-fault-avoidance", default=True, show_default=True,
              help="Skip groups that failed or answered slowly, for a time scaled by latency.")
@click.option("--fault-steps", default=None, metavar="MS:MS,...",
              help="Latency to isolation table, e.g. 550:30000,1000:60000,15000:600000.")
@click.option("--hedge-after-ms", type=click.FloatRange(min=1), default=500.0, show_default=True,
              help="Copy an unanswered unkeyed batch to another group after this long.")
@click.option("--id-prefix", default=None, metavar="P",
              help="Bodies are the ids P-0, P-1, ... (--size is ignored): for recorded runs.")
@click.option("--record", "record_path", type=click.Path(dir_okay=False), default=None,
              help="Append one JSON line per acknowledged message (a history produce_ack "
                   "event: t in ns, id, topic, queue, offset).")
@click.option("--member-id", default=None,
              help="This producer's id among the producers of an ordered topic.")
@click.option("--leader-session-timeout-ms", type=click.IntRange(min=500), default=6000,
              show_default=True,
              help="Ordered topics: how long the brokers keep this producer's leadership "
                   "without a heartbeat.")
@click.option("--delay", default=None, metavar="DURATION",
              help="Deliver each message this long after it is sent (90s, 5m, 2h, 40d): "
                   "consumers get it then, not before (docs/delayed.md).")
@click.option("--deliver-at", default=None, metavar="ISO-8601",
              help="Deliver every message at this time (2026-12-01T09:00:00Z); a time in "
                   "the past is delivered now.")
@click.option("--json", "as_json", is_flag=True, help="End stdout with one JSON summary line.")
def produce(
    bootstrap: tuple[str, ...],
    security: ClientSecurity | None,
    topic: str,
    count: int,
    size: int,
    window: int,
    batch_size: int,
    linger_ms: float,
    key: str | None,
    rate: float | None,
    retries: int,
    send_timeout: float,
    fault_avoidance: bool,
    fault_steps: str | None,
    hedge_after_ms: float,
    id_prefix: str | None,
    record_path: str | None,
    member_id: str | None,
    leader_session_timeout_ms: int,
    delay: str | None,
    deliver_at: str | None,
    as_json: bool,
) -> None:
    """Produce COUNT messages of SIZE bytes and report throughput, ack latency, sends
    never acknowledged (``failed``) and the longest time with sends pending and no
    acknowledgement (``max_ack_gap_ms``, the write stall). To an ordered topic, this
    producer sends only while the brokers hold it the topic's active producer (it stands
    by otherwise)."""
    addrs = _bootstrap(bootstrap)
    try:
        steps = DEFAULT_STEPS if fault_steps is None else parse_steps(fault_steps)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--fault-steps") from None
    if delay is not None and deliver_at is not None:
        raise click.UsageError("--delay and --deliver-at exclude each other")
    when: Callable[[], int] | None = None
    try:
        if delay is not None:
            delay_ms = parse_duration_ms(delay)
            check_deliver_at(int(time.time() * 1000) + delay_ms, int(time.time() * 1000))
            def when() -> int:
                return int(time.time() * 1000) + delay_ms
        elif deliver_at is not None:
            at_ms = parse_deliver_at_ms(deliver_at)
            check_deliver_at(at_ms, int(time.time() * 1000))
            def when() -> int:
                return at_ms
    except ScheduleError as exc:
        raise click.BadParameter(str(exc), param_hint="--delay/--deliver-at") from None
    options = {"retries": retries, "send_timeout_s": send_timeout,
               "fault_avoidance": fault_avoidance, "fault_steps": steps,
               "hedge_after_ms": hedge_after_ms, "member_id": member_id,
               "leader_session_timeout_ms": leader_session_timeout_ms}
    with contextlib.ExitStack() as stack:
        record = stack.enter_context(open(record_path, "a", buffering=1)) if record_path else None
        summary = asyncio.run(
            _produce(
                addrs,
                topic=topic,
                count=count,
                size=size,
                window=window,
                batch_size=batch_size,
                linger_ms=linger_ms,
                key=key.encode() if key is not None else None,
                rate=rate,
                options=options,
                id_prefix=id_prefix,
                record=record,
                deliver_at=when,
                security=security,
            )
        )
    _report(summary, as_json=as_json, title="produce")
    if summary["failed"]:
        sys.exit(1)


async def _produce(
    bootstrap: list[str],
    *,
    topic: str,
    count: int,
    size: int,
    window: int,
    batch_size: int,
    linger_ms: float,
    key: bytes | None,
    rate: float | None = None,
    options: dict[str, Any] | None = None,
    id_prefix: str | None = None,
    record: TextIO | None = None,
    deliver_at: Callable[[], int] | None = None,
    security: ClientSecurity | None = None,
) -> dict[str, Any]:
    producer = Producer(bootstrap, batch_size=batch_size, linger_ms=linger_ms,
                        security=security, **(options or {}))
    slots = asyncio.Semaphore(window)
    latencies: list[float] = []
    errors: list[str] = []
    acked = sent = 0
    prefix = os.urandom(4).hex().encode()
    pad = b"x" * size
    with _progress() as progress, stop_on_signals() as stop:
        task = progress.add_task(f"produce {topic}", total=count, rate="")
        started = time.perf_counter()
        last_draw = started

        outstanding = 0
        progress_at = started  # the last acknowledgement, or when sends became pending
        max_gap = 0.0

        def done(fut: asyncio.Future[tuple[int, int]], *, sent_at: float, body: bytes,
                 due_ms: int) -> None:
            nonlocal acked, outstanding, progress_at, max_gap
            slots.release()
            outstanding -= 1
            if fut.cancelled():
                return
            exc = fut.exception()
            if exc is not None:
                if len(errors) < 5 and str(exc) not in errors:
                    errors.append(str(exc))
                return
            acked += 1
            if record is not None:
                q, off = fut.result()
                event = {"type": "produce_ack", "t": time.time_ns(), "id": body.decode(),
                         "topic": topic, "queue": q, "offset": off}
                if due_ms:
                    event["deliver_at_ms"] = due_ms
                record.write(json.dumps(event) + "\n")
            now = time.perf_counter()
            latencies.append(now - sent_at)
            max_gap = max(max_gap, now - progress_at)
            progress_at = now

        try:
            for i in range(count):
                if rate is not None:
                    delay = started + i / rate - time.perf_counter()
                    if delay > 0:
                        await _sleep_unless(stop, delay)
                if stop.requested:
                    break
                await slots.acquire()
                if outstanding == 0:
                    progress_at = time.perf_counter()
                outstanding += 1
                if id_prefix is not None:
                    body = f"{id_prefix}-{i}".encode()
                else:
                    body = (prefix + b"-%d-" % i + pad)[:size] if size > 20 else pad
                sent_at = time.perf_counter()
                due_ms = deliver_at() if deliver_at is not None else 0
                sending = producer.send(topic, body, key=key, deliver_at_ms=due_ms)
                if sent:
                    fut = await sending
                else:  # the first send learns the route, waiting while no broker answers
                    first = await _unless_stopped(stop, sending)
                    if first is None:
                        slots.release()
                        outstanding -= 1
                        break
                    fut = first
                sent += 1
                fut.add_done_callback(functools.partial(done, sent_at=sent_at, body=body,
                                                        due_ms=due_ms))
                now = time.perf_counter()
                if now - last_draw > 0.2:
                    last_draw = now
                    progress.update(task, completed=acked, rate=f"{acked / (now - started):,.0f} msg/s")
            await producer.flush()
        except (BrokerError, ConnectionError) as exc:
            errors.append(str(exc))
        finally:
            await producer.close()
        elapsed = time.perf_counter() - started
        progress.update(task, completed=acked, rate=f"{acked / elapsed:,.0f} msg/s")
    return {
        "acked": acked,
        # Stopped by a signal, what it did not send has not failed.
        "failed": (sent if stop.requested else count) - acked,
        "stopped_by": stop.signal,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(acked / elapsed, 1) if elapsed > 0 else 0.0,
        "mb_per_s": round(acked * size / elapsed / 1e6, 2) if elapsed > 0 else 0.0,
        "ack_p50_ms": round(_percentile(latencies, 0.50) * 1000, 3),
        "ack_p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
        "max_ack_gap_ms": round(max_gap * 1000, 3),
        "errors": errors,
    }


@click.command(short_help="Consume messages as a consumer group.",
               context_settings={"help_option_names": ["-h", "--help"]})
@client_options
@click.option("--topic", "-t", required=True)
@click.option("--group", "-g", required=True, help="Consumer group.")
@click.option("--count", "-n", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option("--idle-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Stop after this many seconds without a message (polls that find no "
                   "broker to answer are retried until then).")
@click.option("--commit-every", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Commit after this many messages (and at the end). A commit a group "
                   "cannot take now (its brokers down or failing over) is said, kept and "
                   "made again with the next one; the one at the end must be taken.")
@click.option("--session-timeout-ms", type=click.IntRange(min=500), default=6000,
              show_default=True, help="A member silent this long loses its queues.")
@click.option("--member-id", default=None, help="This member's id (default host-pid-random).")
@click.option("--record", "record_path", type=click.Path(dir_okay=False), default=None,
              help="Append one JSON line per delivery and per queue acquired/released.")
@click.option("--nack-every", type=click.IntRange(min=1), default=None, metavar="K",
              help="Hand back every K-th message instead of processing it: it comes again "
                   "after --nack-delay through the group's retry topic (docs/delayed.md). "
                   "One that cannot be handed back ends the command with nothing more "
                   "committed.")
@click.option("--nack-delay", default="1s", show_default=True, metavar="DURATION",
              help="How long a handed-back message waits before it comes again.")
@click.option("--max-reconsume", type=click.IntRange(min=0), default=DEFAULT_MAX_RECONSUME,
              show_default=True,
              help="A message handed back more often goes to %DLQ%<group> instead.")
@click.option("--json", "as_json", is_flag=True, help="End stdout with one JSON summary line.")
def consume(
    bootstrap: tuple[str, ...],
    security: ClientSecurity | None,
    topic: str,
    group: str,
    count: int,
    idle_timeout: float,
    commit_every: int,
    session_timeout_ms: int,
    member_id: str | None,
    record_path: str | None,
    nack_every: int | None,
    nack_delay: str,
    max_reconsume: int,
    as_json: bool,
) -> None:
    """Consume COUNT messages as GROUP, committing as it goes (at-least-once). On a
    cluster topic, several processes with one --group share its queues. With
    --nack-every, every K-th message is handed back (``nacked`` in the summary) and
    redelivered messages count (``redelivered``) like the others."""
    addrs = _bootstrap(bootstrap)
    try:
        nack_delay_ms = parse_duration_ms(nack_delay)
    except ScheduleError as exc:
        raise click.BadParameter(str(exc), param_hint="--nack-delay") from None
    with contextlib.ExitStack() as stack:
        record = stack.enter_context(open(record_path, "a", buffering=1)) if record_path else None
        summary = asyncio.run(
            _consume(addrs, topic=topic, group=group, count=count, idle_timeout=idle_timeout,
                     commit_every=commit_every, session_timeout_ms=session_timeout_ms,
                     member_id=member_id, record=record, nack_every=nack_every,
                     nack_delay_ms=nack_delay_ms, max_reconsume=max_reconsume,
                     security=security)
        )
    _report(summary, as_json=as_json, title="consume")
    if summary["errors"] or (summary["stopped_by"] is None and summary["consumed"] < count):
        sys.exit(1)


async def _consume(
    bootstrap: list[str],
    *,
    topic: str,
    group: str,
    count: int,
    idle_timeout: float,
    commit_every: int,
    session_timeout_ms: int = 6000,
    member_id: str | None = None,
    record: TextIO | None = None,
    nack_every: int | None = None,
    nack_delay_ms: int = 1000,
    max_reconsume: int = DEFAULT_MAX_RECONSUME,
    security: ClientSecurity | None = None,
) -> dict[str, Any]:
    consumer = Consumer(bootstrap, group=group, topic=topic, member_id=member_id,
                        session_timeout_ms=session_timeout_ms, max_reconsume=max_reconsume,
                        security=security)
    nacked = redelivered = dead = 0
    logged = 0

    def flush_ownership() -> None:
        nonlocal logged
        if record is None:
            return
        for t, kind, q in consumer.ownership_log[logged:]:
            record.write(json.dumps({"t": t, "kind": kind, "queue": q,
                                     "member": consumer.member_id}) + "\n")
        logged = len(consumer.ownership_log)

    async def keep_flushing() -> None:
        # Acquisitions and releases reach the record within 0.1 s even while the loop
        # below waits (a commit to a broker cut off): a member killed meanwhile must not
        # leave a release it made in memory only (the harness would date it at the kill).
        while True:
            await asyncio.sleep(0.1)
            flush_ownership()

    consumed = 0
    since_commit = 0
    retried = 0
    unsettled = False  # a message neither processed nor handed back: no commit past it
    errors: list[str] = []
    backoff = Backoff(0.1, 2.0)
    flusher = asyncio.create_task(keep_flushing()) if record is not None else None
    with _progress() as progress, stop_on_signals() as stop:
        task = progress.add_task(f"consume {topic}", total=count, rate="")
        started = time.perf_counter()
        last_seen = started
        try:
            while consumed < count and not stop.requested:
                try:
                    records = await consumer.getmany(timeout_s=0.25)
                except (BrokerError, ConnectionError, OSError, TimeoutError) as exc:
                    if not poll_again(exc):
                        raise
                    # No broker reachable now (a group failing over, a rejoin that found
                    # none): the consumer tries again at the next call, and what it
                    # buffered stays buffered. The idle timeout bounds the wait.
                    retried += 1
                    if time.perf_counter() - last_seen > idle_timeout:
                        errors.append(f"no message for {idle_timeout:g}s; the last poll: {exc}")
                        break
                    delay = backoff.next()
                    _stderr.print(f"consume: {exc}; polling again in {delay:.1f}s", markup=False,
                                  highlight=False)
                    await _sleep_unless(stop, delay)
                    continue
                backoff.reset()
                now = time.perf_counter()
                flush_ownership()
                if not records:
                    if now - last_seen > idle_timeout:
                        errors.append(f"no message for {idle_timeout:g}s")
                        break
                    continue
                last_seen = now
                consumed += len(records)
                since_commit += len(records)
                redelivered += sum(1 for r in records if r.reconsume_times)
                if record is not None:
                    t = time.time()
                    record.write("".join(json.dumps({
                        "t": t, "kind": "deliver", "topic": r.topic, "queue": r.queue,
                        "offset": r.offset, "member": consumer.member_id,
                        "reconsume": r.reconsume_times,
                        "id": r.body[:64].decode("utf-8", "replace")}) + "\n" for r in records))
                if nack_every is not None:
                    for i, r in enumerate(records):
                        if (consumed - len(records) + i + 1) % nack_every == 0:
                            try:
                                resp = await consumer.nack(r, delay_ms=nack_delay_ms)
                            except (BrokerError, ConnectionError, OSError, TimeoutError):
                                # Not handed back (its retries spent): committing past it
                                # would lose it, so the member stops as a crashed one
                                # would, and the group reads it again after the last commit.
                                unsettled = True
                                raise
                            nacked += 1
                            dead += resp.topic.startswith(DLQ_PREFIX)
                if since_commit >= commit_every:
                    # Bounded: a group that cannot take it now is left to the next commit
                    # (the consumer says so), and the other groups' queues go on.
                    await consumer.commit(timeout_s=COMMIT_WAIT_S)
                    since_commit = 0
                progress.update(task, completed=min(consumed, count),
                                rate=f"{consumed / (now - started):,.0f} msg/s")
            await consumer.commit()
        except (BrokerError, ConnectionError, OSError, TimeoutError) as exc:
            errors.append(str(exc))
        finally:
            if flusher is not None:
                await stop_tasks([flusher])
            await (consumer.abort() if unsettled else consumer.close())
            flush_ownership()
        elapsed = time.perf_counter() - started
    return {
        "consumed": consumed,
        "member": consumer.member_id,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(consumed / elapsed, 1) if elapsed > 0 else 0.0,
        "positions": {str(q): o for q, o in sorted(consumer.positions.items())},
        "nacked": nacked,
        "redelivered": redelivered,
        "dead_lettered": dead,
        "commit_failures": consumer.commit_failures,
        "polls_retried": retried,
        "stopped_by": stop.signal,
        "errors": errors,
    }


def poll_again(exc: BaseException) -> bool:
    """Whether ``understudy consume`` polls again after ``getmany`` raised ``exc``: yes
    when no broker could answer now or the one that did will not for a while (a route
    to move, a member to rejoin); no for what waiting does not change (not authorized,
    an unknown topic, a damaged record). Pure."""
    if isinstance(exc, BrokerError):
        return exc.retriable or exc.status == p.Status.UNKNOWN_MEMBER
    return isinstance(exc, (ConnectionError, OSError, TimeoutError))


def _report(summary: dict[str, Any], *, as_json: bool, title: str) -> None:
    for err in summary.get("errors", []):
        _stderr.print(f"[red]{title}: {err}")
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
        return
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k, v in summary.items():
        if k != "errors":
            table.add_row(k, str(v))
    Console().print(table)


@click.group(short_help="Create and inspect topics.",
             context_settings={"help_option_names": ["-h", "--help"]})
def topic() -> None:
    """Create and inspect topics."""


@topic.command("create")
@client_options
@click.option("--topic", "-t", "name", required=True)
@click.option("--queues", "-q", type=click.IntRange(1, 65535), default=4, show_default=True,
              help="Without --groups: queues of a topic on the bootstrap broker's group.")
@click.option("--groups", default=None, metavar="G1,G2",
              help="Spread the topic over these broker groups (a cluster topic).")
@click.option("--queues-per-group", type=click.IntRange(1, 1024), default=None,
              help="Queues on each group of --groups (default 4; an ordered topic has 1).")
@click.option("--ordered", is_flag=True,
              help="A strictly ordered topic: one queue per group, written through the send "
                   "chain and read through the consume chain (docs/ordered.md).")
@click.option("--json", "as_json", is_flag=True, help="Print the topic as one JSON object.")
def topic_create(bootstrap: tuple[str, ...], security: ClientSecurity | None, name: str, queues: int, groups: str | None,
                 queues_per_group: int | None, ordered: bool, as_json: bool) -> None:
    """Create TOPIC: over --groups with --queues-per-group queues each (stored in
    ZooKeeper by the broker; any broker then serves its route), or, without --groups,
    with --queues queues on the bootstrap broker's group (grows; never shrinks)."""
    boot = _bootstrap(bootstrap)
    if groups is None:
        if queues_per_group is not None or ordered:
            raise click.UsageError("--queues-per-group and --ordered need --groups")
        try:
            resp = asyncio.run(create_topic(boot, topic=name, queues=queues, security=security))
        except (BrokerError, ConnectionError) as exc:
            raise click.ClickException(str(exc)) from exc
        if as_json:
            click.echo(json.dumps({"topic": resp.topic, "queues": resp.queues,
                                   "created": resp.created}))
            return
        verb = "created" if resp.created else "exists"
        click.echo(f"topic {resp.topic}: {verb}, {resp.queues} queues")
        return
    names = [g.strip() for g in groups.split(",") if g.strip()]
    per_group = queues_per_group or (1 if ordered else 4)
    req = p.AdminTopicRequest("create", name, names, per_group, ordered=ordered)
    _admin(boot, req, as_json, security)


def _admin(boot: list[str], req: p.AdminTopicRequest, as_json: bool,
           security: ClientSecurity | None) -> None:
    try:
        resp = asyncio.run(admin_topic(boot, req, security))
    except (BrokerError, ConnectionError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    placement = [{"queue": q, "group": g} for q, g in enumerate(resp.placement) if g is not None]
    if as_json:
        click.echo(json.dumps({"topic": resp.topic, "action": req.action,
                               "ordered": resp.ordered, "queues": placement}))
        return
    if req.action == "delete":
        click.echo(f"topic {resp.topic}: deleted")
        return
    per: dict[str, int] = {}
    for e in placement:
        per[str(e["group"])] = per.get(str(e["group"]), 0) + 1
    spread = ", ".join(f"{g}: {n}" for g, n in per.items())
    click.echo(f"topic {resp.topic}: {req.action}d, {len(placement)} queues ({spread})")


@topic.command("alter")
@client_options
@click.option("--topic", "-t", "name", required=True)
@click.option("--add-groups", default="", metavar="G3,...", help="Groups to add queues on.")
@click.option("--remove-groups", default="", metavar="G2,...",
              help="Groups whose queues are removed (only when drained, or with --force).")
@click.option("--queues-per-group", type=click.IntRange(1, 1024), default=None,
              help="Grow (or, with the backlog rule, shrink) every group to this many queues.")
@click.option("--force", is_flag=True, help="Remove queues even if they hold unconsumed messages.")
@click.option("--json", "as_json", is_flag=True)
def topic_alter(bootstrap: tuple[str, ...], security: ClientSecurity | None, name: str, add_groups: str, remove_groups: str,
                queues_per_group: int | None, force: bool, as_json: bool) -> None:
    """Add groups or queues to a cluster topic, or remove drained ones."""
    def split(v: str) -> list[str]:
        return [g.strip() for g in v.split(",") if g.strip()]
    if not (add_groups or remove_groups or queues_per_group):
        raise click.UsageError("nothing to change: give --add-groups, --remove-groups or "
                               "--queues-per-group")
    req = p.AdminTopicRequest("alter", name, queues_per_group=queues_per_group,
                              add_groups=split(add_groups), remove_groups=split(remove_groups),
                              force=force)
    _admin(_bootstrap(bootstrap), req, as_json, security)


@topic.command("delete")
@client_options
@click.option("--topic", "-t", "name", required=True)
@click.option("--force", is_flag=True, help="Delete even if queues hold unconsumed messages.")
@click.option("--json", "as_json", is_flag=True)
def topic_delete(bootstrap: tuple[str, ...], security: ClientSecurity | None, name: str, force: bool, as_json: bool) -> None:
    """Delete a cluster topic (refused while it holds unconsumed messages, unless --force)."""
    _admin(_bootstrap(bootstrap), p.AdminTopicRequest("delete", name, force=force), as_json,
           security)


@topic.command("describe")
@client_options
@click.option("--topic", "-t", "name", required=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def topic_describe(bootstrap: tuple[str, ...], security: ClientSecurity | None, name: str, as_json: bool) -> None:
    """Per queue: group, writer, reader, log end; per consumer group: owner, committed
    offset and lag. An ordered topic also shows its send head, consume head and active
    producer."""
    try:
        d = asyncio.run(describe_topic(_bootstrap(bootstrap), name, security))
    except (BrokerError, ConnectionError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(d))
        return
    table = Table(title=f"topic {name}")
    for col in ("queue", "group", "writer", "reader", "log end", "consumer group", "owner",
                "committed", "lag"):
        table.add_column(col)
    for q in d["queues"]:
        base = [str(q["queue"]), q["group"], q["writer"] or "-", q["reader"] or "-",
                "?" if q["log_end"] is None else str(q["log_end"])]
        if not q["consumer_groups"]:
            table.add_row(*base, "-", "-", "-", "-")
        for i, c in enumerate(q["consumer_groups"]):
            row = base if i == 0 else [""] * 5
            table.add_row(*row, c["consumer_group"], c["owner"] or "-",
                          str(c["committed"]), str(c["lag"]))
    Console().print(table)
    if "send_head" in d:
        prods = d.get("producers") or {}
        standby = [m for m in prods.get("members", []) if m != prods.get("active")]
        Console().print(
            f"ordered: send head {d['send_head'] or '- (sends wait)'}, consume head "
            f"{d['consume_head'] or '-'}; active producer {prods.get('active') or '-'}"
            f" (generation {prods.get('generation', '-')}), standing by: "
            f"{', '.join(standby) or '-'}")


@click.group("consumer-group", short_help="Inspect consumer groups.",
             context_settings={"help_option_names": ["-h", "--help"]})
def consumer_group() -> None:
    """Inspect consumer groups (members and queue ownership are held by the brokers)."""


@consumer_group.command("list")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def consumer_group_list(bootstrap: tuple[str, ...], security: ClientSecurity | None, as_json: bool) -> None:
    """Every consumer group, with its member count and assignment generation."""
    try:
        groups = asyncio.run(list_consumer_groups(_bootstrap(bootstrap), security))
    except (BrokerError, ConnectionError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps({"groups": groups}))
        return
    table = Table()
    for col in ("consumer group", "members", "generation"):
        table.add_column(col)
    for g in groups:
        table.add_row(str(g["group"]), str(g["members"]), str(g["generation"]))
    Console().print(table)


@consumer_group.command("describe")
@client_options
@click.option("--group", "-g", "cgroup", required=True, help="The consumer group.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def consumer_group_describe(bootstrap: tuple[str, ...], security: ClientSecurity | None, cgroup: str, as_json: bool) -> None:
    """Members, and per queue: owner, committed offset, lag."""
    try:
        d = asyncio.run(describe_consumer_group(_bootstrap(bootstrap), cgroup, security))
    except (BrokerError, ConnectionError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(d))
        return
    click.echo(f"consumer group {cgroup}: generation {d['generation']}, "
               f"{len(d['members'])} member(s)")
    table = Table()
    for col in ("topic", "queue", "member", "handing to", "committed", "lag"):
        table.add_column(col)
    for a in d["assignment"]:
        table.add_row(a["topic"], str(a["queue"]), a["member"], a["next"] or "-",
                      str(a["committed"]), str(a["lag"]))
    Console().print(table)


@topic.command("list")
@client_options
@click.option("--json", "as_json", is_flag=True)
def topic_list(bootstrap: tuple[str, ...], security: ClientSecurity | None, as_json: bool) -> None:
    """Show topics and the group's brokers with their effective permission."""

    async def fetch() -> Any:
        router = Router(_bootstrap(bootstrap), security=security)
        try:
            return await router.refresh()
        finally:
            await router.close()

    try:
        route = asyncio.run(fetch())
    except (BrokerError, ConnectionError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(route.encode().decode())
        return
    table = Table(title="brokers")
    for col in ("group", "broker", "address", "role", "permission", "epoch"):
        table.add_column(col)
    labels = {0: "NONE", 1: "READ", 2: "WRITE", 3: "FULL"}
    for g in route.groups:
        for b in g.brokers:
            perm = labels[b.permission] if b.reachable else "unreachable"
            table.add_row(g.group, b.name, b.address, b.role, perm, str(b.epoch))
    Console().print(table)
    for name, queues in sorted(route.topics.items()):
        click.echo(f"topic {name}: {queues} queues")
