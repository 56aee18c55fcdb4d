"""The broker and client commands: bad flags get a clear message naming the problem and
exit code 2; how the client commands poll again, stop on a signal, and where a commit stops."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from understudy_broker import protocol as p
from understudy_broker.cli import cli
from understudy_broker.cli.client import poll_again, stop_on_signals
from understudy_broker.client import BrokerError, DamagedRecord, SecurityError, commit_point
from understudy_operator.local.ports import free_port

UNDERSTUDY = str(Path(sys.executable).with_name("understudy"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "70000", "--replication-port", "9001"], "outside 0-65535"),
        (["--port", "9000"], "needs --replication-port"),
        (["--port", "9000", "--replication-port", "9000"], "must differ"),
        (["--port", "9000", "--role", "slave"], "needs --master"),
        (["--port", "9000", "--role", "slave", "--master", "nohost"], "expected HOST:PORT"),
        (["--port", "9000", "--role", "slave", "--master", "h:70000"],
         "--master: port 70000 is outside 1-65535 in 'h:70000'"),
        (["--port", "9000", "--role", "slave", "--master", "h:1", "--permission", "FULL"], "never writes"),
        (["--port", "9000", "--replication-port", "9001", "--master", "h:1"], "--role slave"),
        (["--port", "9000", "--replication-port", "9001", "--peer", "oops"], "NAME=HOST:PORT"),
        (["--port", "9000", "--replication-port", "9001", "--segment-bytes", "10"], "--segment-bytes"),
        (["--port", "9000", "--replication-port", "9001", "--index-open-files", "0"],
         "--index-open-files must be at least 1"),
        (["--port", "9000", "--replication-port", "9001", "--max-frame-bytes", "10"], "--max-frame-bytes"),
        (["--port", "9000", "--replication-port", "9001", "--permission", "ALL"], "--permission"),
        (["--port", "nine", "--replication-port", "9001"], "--port"),
        (["--port", "9000", "--replication-port", "9001", "--min-insync-replicas", "2",
          "--in-sync-replicas", "2"], "--in-sync-replicas 2 counts the master: it must be at "
                                      "least --min-insync-replicas + 1 (3)"),
        (["--port", "9000", "--replication-port", "9001", "--max-lag-bytes", "0"],
         "--max-lag-bytes must be positive"),
    ],
)
def test_bad_broker_flags_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["broker", "--data-dir", str(tmp_path / "d"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "d").exists()  # nothing was created


@pytest.mark.parametrize(
    "args",
    [
        ["produce", "--bootstrap", "nocolon", "--topic", "t"],
        ["produce", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--count", "0"],
        ["consume", "--bootstrap", "127.0.0.1:1", "--topic", "t"],  # no --group
        ["topic", "create", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--queues", "0"],
    ],
)
def test_bad_client_flags_exit_2(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Error" in result.output


def test_console_script_reports_bad_flags_with_exit_2(tmp_path: Path) -> None:
    out = subprocess.run(
        [UNDERSTUDY, "broker", "--data-dir", str(tmp_path), "--port", "9000", "--role", "slave"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert out.returncode == 2
    assert "needs --master" in out.stderr


def test_unreachable_broker_is_a_clear_error_not_a_traceback() -> None:
    result = CliRunner().invoke(
        cli, ["topic", "create", "--bootstrap", "127.0.0.1:1", "--topic", "t"]
    )
    assert result.exit_code == 1
    assert "no broker answered" in result.output
    assert "Traceback" not in result.output


def test_help_is_true() -> None:
    result = CliRunner().invoke(cli, ["broker", "--help"])
    assert result.exit_code == 0
    for flag in ("--data-dir", "--replication-port", "--role", "--master", "--sync / --async",
                 "--permission", "--peer", "--flush", "--auto-degrade / --no-auto-degrade",
                 "--in-sync-replicas", "--min-insync-replicas", "--max-lag-bytes"):
        assert flag in result.output


@pytest.mark.parametrize(("exc", "again"), [
    (ConnectionError("no broker answered GET_ROUTE: 127.0.0.1:1: refused"), True),
    (TimeoutError(), True),
    (OSError("network unreachable"), True),
    (BrokerError(p.Status.NOT_MASTER, "route moved"), True),
    (BrokerError(p.Status.TIMEOUT, "hung"), True),
    (BrokerError(p.Status.UNKNOWN_MEMBER, "session expired"), True),
    (BrokerError(p.Status.NOT_AUTHORIZED, "may not join group 'g'"), False),
    (BrokerError(p.Status.UNKNOWN_TOPIC, "unknown topic 't'"), False),
    (SecurityError(p.Status.AUTHENTICATION_FAILED, "wrong password"), False),
    (DamagedRecord(p.Status.CORRUPT_RECORD, "crc", address="a", topic="t", queue=0, offset=7), False),
])
def test_consume_polls_again_after_what_waiting_can_mend_only(exc: BaseException, again: bool) -> None:
    assert poll_again(exc) is again


def test_consume_with_no_broker_answering_polls_until_its_idle_timeout_and_says_why() -> None:
    result = CliRunner().invoke(cli, ["consume", "-b", f"127.0.0.1:{free_port()}", "-t", "t", "-g", "g",
                                      "--idle-timeout", "1", "--json"])
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["consumed"] == 0
    assert summary["polls_retried"] >= 2, summary  # it did not end at the first poll
    (error,) = summary["errors"]
    assert error.startswith("no message for 1s; the last poll: no broker answered GET_ROUTE"), error
    assert "polling again in" in result.stderr
    assert "Traceback" not in result.output


def test_the_first_signal_asks_a_command_to_stop_and_the_next_acts_as_without_it() -> None:
    async def run() -> tuple[str | None, object, object]:
        with stop_on_signals() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            async with asyncio.timeout(5):
                await stop.event.wait()
            return stop.signal, signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    assert asyncio.run(run()) == ("SIGTERM", signal.SIG_DFL, signal.default_int_handler)


@pytest.mark.parametrize(("position", "failed", "committed", "expected"), [
    (10, [], None, 10),          # nothing failed: up to what was delivered
    (10, [], 10, None),          # already committed there: nothing new
    (10, [4, 7], None, 4),       # not past the first record whose nack failed
    (10, [4], 2, 4),
    (10, [4], 4, None),          # committed up to it already
    (10, [4], 6, None),          # committed past it before the nack failed: not taken back
    (3, [4], None, 3),           # a failed record beyond what was delivered does not hold it
])
def test_a_commit_stops_at_a_record_whose_nack_failed(
        position: int, failed: list[int], committed: int | None, expected: int | None) -> None:
    assert commit_point(position, failed, committed) == expected
