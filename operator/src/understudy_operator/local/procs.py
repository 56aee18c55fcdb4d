"""Detached processes with pid files: start, signal, check, stop — always by PID.

Why this module exists: ``understudy local up`` returns while the ZooKeeper server, the
brokers and the controller keep running, and a later ``local status``/``kill``/``down``
(another process) must find them again. So every process gets its own session (a
terminal's Ctrl-C never reaches it), its output goes to a log file, and its PID goes to
``<dir>/pids/<name>.pid`` — the same files the local controller reads as its process
table. Liveness is judged from ``/proc``: a PID that now belongs to some other program
(PID reuse) or a zombie does not count as alive.

Nothing here kills by name: every signal goes to one PID this cluster recorded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: Signals ``local kill`` accepts, by the names people type.
SIGNALS: dict[str, signal.Signals] = {
    "KILL": signal.SIGKILL,
    "STOP": signal.SIGSTOP,
    "TERM": signal.SIGTERM,
    "CONT": signal.SIGCONT,
}


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """What ``/proc`` says about a recorded PID."""

    pid: int
    alive: bool
    stopped: bool = False
    exit_status: int | None = None  # known when this process reaped it


def pid_file(pid_dir: Path, name: str) -> Path:
    return pid_dir / f"{name}.pid"


def read_pid(pid_dir: Path, name: str) -> int | None:
    """The recorded PID, or ``None`` if there is no (readable, well-formed) pid file."""
    return read_pid_file(pid_file(pid_dir, name))


def read_small(path: str | Path, size: int) -> bytes:
    """The first ``size`` bytes of a small file, by ``os.open``/``os.read``: the local
    controller reads a pid file or ``/proc/<pid>/stat`` for each broker at every check of
    every group, and through ``pathlib`` those reads were over half of its event-loop time
    at rest (``bench/scale.py``, 20 groups, py-spy: 58 us a broker, 17 us this way)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def read_pid_file(path: str | Path) -> int | None:
    """The pid in ``path``, or ``None`` if the file is missing or malformed (logged). A pid
    must be positive: ``kill(0, sig)`` would signal our own process group."""
    try:
        text = read_small(path, 4096).decode("ascii", errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read pid file %s: %s", path, exc)
        return None
    if not text.isdigit() or int(text) <= 0:
        log.warning("pid file %s does not hold a pid: %r", path, text[:40])
        return None
    return int(text)


def write_pid(pid_dir: Path, name: str, pid: int) -> None:
    pid_dir.mkdir(parents=True, exist_ok=True)
    path = pid_file(pid_dir, name)
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(path)  # readers never see a half-written file


def remove_pid(pid_dir: Path, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        pid_file(pid_dir, name).unlink()


def proc_state_letter(pid: int) -> str | None:
    """The state letter from ``/proc/<pid>/stat`` (``R``, ``S``, ``T``, ``Z``, ...), or
    ``None`` if the process does not exist. The command name may contain spaces and
    parentheses, so parse after the *last* ``)``."""
    try:
        raw = read_small(f"/proc/{pid}/stat", 4096)
    except OSError:
        return None
    tail = raw[raw.rfind(b")") + 1 :].split()
    return tail[0].decode("ascii", "replace") if tail else None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def reap(pid: int) -> int | None:
    """Collect ``pid`` if it is our exited child (so it does not linger as a zombie);
    returns its exit status (negative: killed by that signal) when it was collected."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        return None
    return os.waitstatus_to_exitcode(status) if got == pid else None


def inspect(pid: int | None, *, marker: str) -> ProcInfo | None:
    """Is ``pid`` still the process we started? ``marker`` is an argument its command
    line must contain (the broker name, the ZooKeeper config path), which guards against
    PID reuse."""
    if pid is None:
        return None
    status = reap(pid)
    state = proc_state_letter(pid)
    if state in ("Z", "X"):  # it died between the two looks: collect it now
        status = reap(pid) if status is None else status
        return ProcInfo(pid, alive=False, exit_status=status)
    if state is None:
        return ProcInfo(pid, alive=False, exit_status=status)
    cmdline = _cmdline(pid)
    # An empty command line means the process is between states (exec'ing, or exiting
    # and already without memory): it is still there, so it counts as alive until
    # /proc says otherwise. A non-empty one without the marker is another program.
    if cmdline and marker not in cmdline:
        return ProcInfo(pid, alive=False)
    return ProcInfo(pid, alive=True, stopped=state in ("T", "t"))


def wait_stopped(pid: int, *, marker: str, timeout: float = 2.0) -> bool:
    """After SIGSTOP: wait until the kernel shows the process frozen (signals are
    delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = inspect(pid, marker=marker)
        if info is None or not info.alive:
            return False
        if info.stopped:
            return True
        time.sleep(0.005)
    return False


def spawn(argv: list[str], *, log: Path, cwd: Path, env: dict[str, str] | None = None) -> int:
    """Start ``argv`` detached (own session, stdin closed, output appended to ``log``)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    detach(proc)
    return proc.pid


def detach(proc: subprocess.Popen[bytes]) -> None:
    """Let go of a child that must outlive this command.

    The PID is recorded in a pid file and the exit status is collected by :func:`reap`
    while this process is still its parent; marking the ``Popen`` as finished keeps its
    destructor from warning that the process is "still running" — which is the point.
    """
    proc.returncode = 0


def stop_group(proc: subprocess.Popen[bytes], *, timeout: float) -> None:
    """Stop a child started in its own process group (``start_new_session``) by its PID:
    SIGTERM to the group, SIGKILL after ``timeout``, and reap it."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


def send(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to one PID; a process that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def stop(pid: int, *, marker: str, timeout: float = 5.0) -> bool:
    """Stop one process: SIGTERM (plus SIGCONT if it is frozen), then SIGKILL after
    ``timeout``. Returns True if it was running."""
    info = inspect(pid, marker=marker)
    if info is None or not info.alive:
        return False
    send(pid, signal.SIGTERM)
    if info.stopped:
        send(pid, signal.SIGCONT)
    if wait_gone(pid, marker=marker, timeout=timeout):
        return True
    send(pid, signal.SIGKILL)
    wait_gone(pid, marker=marker, timeout=timeout)
    return True


def wait_gone(pid: int, *, marker: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = inspect(pid, marker=marker)
        if info is None or not info.alive:
            _collect(pid, deadline=deadline)
            return True
        time.sleep(0.02)
    return False


def _collect(pid: int, *, deadline: float) -> None:
    """Reap ``pid`` if it is our child and a zombie. A multi-threaded process (a JVM: the
    ZooKeeper servers) shows ``Z`` as soon as its main thread ends, while its other threads
    still exit, and cannot be collected until they have: wait for that, or it stays a
    zombie for as long as this process lives."""
    while proc_state_letter(pid) in ("Z", "X") and time.monotonic() < deadline:
        try:
            got, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return  # not our child: its parent (or init) collects it
        if got == pid:
            return
        time.sleep(0.005)


def mentioning(text: str) -> list[int]:
    """PIDs whose command line mentions ``text`` (e.g. a cluster's state directory)."""
    out = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
    return out


def kill_leftovers(directory: Path) -> list[int]:
    """Last-resort cleanup for a local cluster's state directory: kill by PID (woken
    first, in case it is frozen) every process whose command line names ``directory``,
    reap our own children, and stop the ZooKeeper recorded in its pid file. Returns the
    PIDs that were still running, so a caller can treat any as a leak."""
    leftovers = mentioning(str(directory))
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        reap(pid)
    zk_pid = read_pid(directory / "pids", "zookeeper")
    if zk_pid is not None:
        stop(zk_pid, marker=str(directory / "zookeeper" / "conf" / "zoo.cfg"))
    return leftovers
