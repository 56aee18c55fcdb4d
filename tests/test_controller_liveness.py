"""ProcessTableLiveness: pid files, pidfd exit events, stopped processes, bad pid files."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from understudy_operator.controller.liveness import (
    NullLiveness,
    ProcessTableLiveness,
    classify,
)
from understudy_operator.controller.observe import ProcessState
from understudy_operator.local.procs import proc_state_letter


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            stdin=subprocess.DEVNULL, start_new_session=True)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = _sleeper()
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


async def test_exit_is_an_event(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    loop = asyncio.get_running_loop()
    (tmp_path / "b0.pid").write_text(f"{sleeper.pid}\n")
    src = ProcessTableLiveness(tmp_path, loop)
    exited: asyncio.Queue[str] = asyncio.Queue()
    src.subscribe(exited.put_nowait)
    try:
        src.track(["b0", "b1"])
        assert src.process_state("b0") is ProcessState.RUNNING
        assert src.process_state("b1") is ProcessState.UNKNOWN  # no pid file
        os.kill(sleeper.pid, signal.SIGSTOP)
        await asyncio.sleep(0.05)
        assert src.process_state("b0") is ProcessState.STOPPED
        os.kill(sleeper.pid, signal.SIGKILL)
        # Not reaped yet (a zombie): the pidfd still reports the exit as an event.
        async with asyncio.timeout(10):
            assert await exited.get() == "b0"
        assert src.process_state("b0") is ProcessState.EXITED
        sleeper.wait(timeout=10)
        assert src.process_state("b0") is ProcessState.EXITED
    finally:
        src.close()


@pytest.fixture
def dead() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.DEVNULL)
    proc.wait(timeout=10)
    return proc


async def test_an_exit_seen_by_a_check_first_is_announced_then_once(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """A check that finds the process gone before the pidfd's readiness reached the loop
    announces the exit there and then (the controller dates the exit event by its
    listener), so nothing acts on an exit whose event comes later; the pidfd does not
    announce it a second time."""
    loop = asyncio.get_running_loop()
    (tmp_path / "b0.pid").write_text(f"{sleeper.pid}\n")
    src = ProcessTableLiveness(tmp_path, loop)
    exited: list[str] = []
    src.subscribe(exited.append)
    try:
        src.track(["b0"])
        assert src.process_state("b0") is ProcessState.RUNNING
        os.kill(sleeper.pid, signal.SIGKILL)
        # No await between the kill and the check: the loop has not run the pidfd's reader.
        deadline = loop.time() + 10
        while src.process_state("b0") is not ProcessState.EXITED:
            assert loop.time() < deadline, "the kill never showed in /proc"
        assert exited == ["b0"]
        await asyncio.sleep(0.1)  # the loop runs: the pidfd's reader is gone with the event
        assert exited == ["b0"]
        assert src.process_state("b0") is ProcessState.EXITED
        assert exited == ["b0"]
    finally:
        src.close()


async def test_new_pid_file_is_followed(tmp_path: Path, sleeper: subprocess.Popen[bytes],
                                        dead: subprocess.Popen[bytes]) -> None:
    loop = asyncio.get_running_loop()
    src = ProcessTableLiveness(tmp_path, loop)
    try:
        (tmp_path / "b0.pid").write_text(str(dead.pid))
        assert src.process_state("b0") is ProcessState.EXITED
        (tmp_path / "b0.pid").write_text(str(sleeper.pid))  # restarted
        assert src.process_state("b0") is ProcessState.RUNNING
    finally:
        src.close()


async def test_a_broker_restarted_under_its_name_is_followed_to_its_new_process(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """While a broker's process runs, the process is followed by its pidfd, not the pid
    file at every check: once it exits the pid file is read again and the broker's next
    process is the one reported (a stop of it shows), and that one's exit is still an
    event after its pid file was removed first (a stop that cleans up)."""
    loop = asyncio.get_running_loop()
    (tmp_path / "b0.pid").write_text(f"{sleeper.pid}\n")
    src = ProcessTableLiveness(tmp_path, loop)
    exited: asyncio.Queue[str] = asyncio.Queue()
    src.subscribe(exited.put_nowait)
    second = _sleeper()
    try:
        src.track(["b0"])
        assert src.process_state("b0") is ProcessState.RUNNING
        os.kill(sleeper.pid, signal.SIGKILL)
        sleeper.wait(timeout=10)
        async with asyncio.timeout(10):
            assert await exited.get() == "b0"
        assert src.process_state("b0") is ProcessState.EXITED
        (tmp_path / "b0.pid").write_text(f"{second.pid}\n")  # restarted
        assert src.process_state("b0") is ProcessState.RUNNING
        os.kill(second.pid, signal.SIGSTOP)
        await asyncio.sleep(0.05)
        assert src.process_state("b0") is ProcessState.STOPPED
        (tmp_path / "b0.pid").unlink()
        assert src.process_state("b0") is ProcessState.STOPPED  # the process, not the file
        os.kill(second.pid, signal.SIGKILL)
        second.wait(timeout=10)
        async with asyncio.timeout(10):
            assert await exited.get() == "b0"
        assert src.process_state("b0") is ProcessState.UNKNOWN  # stopped for good
    finally:
        src.close()
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait(timeout=10)


@pytest.mark.parametrize("content", ["", "not-a-pid", "-5", "0"])
async def test_malformed_pid_file_is_unknown(tmp_path: Path, content: str) -> None:
    (tmp_path / "b0.pid").write_text(content)
    src = ProcessTableLiveness(tmp_path, asyncio.get_running_loop())
    try:
        assert src.process_state("b0") is ProcessState.UNKNOWN
    finally:
        src.close()


def test_proc_stat_parsing_and_classification() -> None:
    assert proc_state_letter(os.getpid()) in ("R", "S")
    assert classify(None) is ProcessState.EXITED
    assert classify("Z") is ProcessState.EXITED
    assert classify("T") is ProcessState.STOPPED
    assert classify("t") is ProcessState.STOPPED
    assert classify("D") is ProcessState.RUNNING
    assert NullLiveness().process_state("x") is ProcessState.UNKNOWN
