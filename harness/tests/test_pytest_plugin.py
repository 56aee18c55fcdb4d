"""The shared pytest plugin: a run ended by SIGTERM still stops the servers its fixtures
started (Python's default for SIGTERM ends the process without unwinding: a stopped
``make test`` left its ZooKeeper and brokers running), also after a test put Python's
default back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

MODULE = '''
import os, pathlib, signal, subprocess, time
import pytest

def test_a_command_run_in_process_left_the_default_behind():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as asyncio's remove_signal_handler does

@pytest.fixture
def server():
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    pathlib.Path(os.environ["SERVER_PID"]).write_text(str(proc.pid))
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()

def test_runs_until_stopped(server):
    time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def test_sigterm_ends_a_run_with_its_fixtures_servers_stopped(tmp_path: Path) -> None:
    (tmp_path / "test_server.py").write_text(MODULE)
    pid_file = tmp_path / "server.pid"
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "understudy_harness.pytest_plugin", "test_server.py"],
        cwd=tmp_path, env={**os.environ, "SERVER_PID": str(pid_file)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = 0
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert run.poll() is None, run.communicate()[0]
            assert time.monotonic() < deadline, "the test's server never started"
            time.sleep(0.05)
        server = int(pid_file.read_text())
        assert _alive(server)
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=60)
        assert run.returncode == 2, out  # pytest's "interrupted"
        assert "KeyboardInterrupt: signal SIGTERM" in out
        assert not _alive(server), "the fixture's server outlived the run"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if server and _alive(server):
            os.kill(server, signal.SIGKILL)
