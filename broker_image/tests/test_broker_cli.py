"""Bad broker/client flags: a clear message naming the problem and exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from understudy_broker.cli import cli

UNDERSTUDY = str(Path(sys.executable).with_name("understudy"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "70000", "--replication-port", "9001"], "outside 0-65535"),
        (["--port", "9000"], "needs --replication-port"),
        (["--port", "9000", "--replication-port", "9000"], "must differ"),
        (["--port", "9000", "--role", "slave"], "needs --master"),
        (["--port", "9000", "--role", "slave", "--master", "nohost"], "expected HOST:PORT"),
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
