"""The SLA job on a real Spark standalone cluster, submitted the way a cluster user runs it.

A master and one worker (1 core, 1 GB) are started from the installed PySpark's own
``bin/spark-class`` on 127.0.0.1, each in its own process group; the test goes on once
the master's ``/json`` lists the worker as alive. Then:

- ``spark-submit --master spark://127.0.0.1:P spark_jobs/src/understudy_spark/job.py``
  (the entry point of ``docs/sla-cluster.md``) reads a small synthetic ``promtool tsdb
  dump`` export; its ``incidents.csv`` and ``daily.csv`` must equal those of the same job
  run with ``local[*]`` (the tests' session, alongside the cluster's start) over the same
  files. The dump reader makes the executor start a Python worker (the series-head table
  goes from the driver to the executors through PySpark's ``createDataFrame``): the test
  requires that it did, so the executors ran the venv's Python (``spark.pyspark.python``)
  and imported this checkout's packages (the editable install; no ``--py-files`` here).
  With ``UNDERSTUDY_SPARK_PROBE=1`` a probe application first checks that directly
  (~15 s more).

Everything listens on 127.0.0.1 only (``SPARK_LOCAL_IP``, ``spark.driver.host`` and
``bindAddress``, the master's REST server off): while the job runs, the listening sockets
of every process of the master's, the worker's (executors, Python workers) and
spark-submit's (driver) process groups are sampled from /proc. Whatever happens, both
daemons are stopped by PID (SIGTERM to their process group, SIGKILL after 10 s); their
logs, the executors' logs and spark-submit's output stay under ``tmp_path`` and their
tails are printed when something fails.

The JVMs run with C1 only and the serial GC (``JVM_OPTS``): start-up bound work on 2
busy cores (one comparison: the job under spark-submit 95 s without, 33 s with); it
changes nothing the job computes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import pytest

pyspark = pytest.importorskip("pyspark", reason="the SLA tests need PySpark (pip install 'understudy[spark]')")

import understudy_broker  # noqa: E402
import understudy_spark  # noqa: E402
from understudy_spark import job  # noqa: E402
from understudy_spark.synth import SynthSpec, synthesize  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

LOOPBACK = "127.0.0.1"
LOOPBACK_FORMS = {LOOPBACK, f"::ffff:{LOOPBACK}"}  # Java listens on IPv6 sockets, IPv4-mapped
SPARK_HOME = pathlib.Path(pyspark.__file__).resolve().parent  # a pip-installed PySpark is a Spark home
PYTHON = sys.executable  # the venv's interpreter; not resolved, the venv is found from this path
JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


# --------------------------------------------------------------------------- harness


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def group_members(pgid: int) -> list[int]:
    """The live PIDs of process group ``pgid`` (from /proc/*/stat). Zombies are left out:
    ``spark-class`` leaves one (its launcher subshell, orphaned when bash execs java) until
    PID 1 reaps it."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            # pid (comm) state ppid pgrp ...; comm may hold blanks and parentheses
            state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
            if int(pgrp) == pgid and state != "Z":
                members.append(int(entry))
    return members


def _stop_group(proc: subprocess.Popen[bytes], *, grace_s: float = 10.0) -> None:
    """SIGTERM to the process group that ``proc`` leads (the daemon and whatever it
    started: executors, Python workers), then SIGKILL to whatever of it is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    if proc.poll() is None or group_members(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _decode_addr(hex_addr: str) -> str:
    ip, port = hex_addr.split(":")
    if len(ip) == 8:
        host = socket.inet_ntop(socket.AF_INET, bytes.fromhex(ip)[::-1])
    else:  # /proc/net/tcp6: four little-endian 32-bit words
        raw = b"".join(bytes.fromhex(ip[i:i + 8])[::-1] for i in range(0, 32, 8))
        host = socket.inet_ntop(socket.AF_INET6, raw)
    return f"{host}:{int(port, 16)}"


def listening(pids: Sequence[int]) -> dict[int, list[str]]:
    """The TCP addresses each of ``pids`` listens on (from /proc, no tools needed)."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found: dict[int, list[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as fh:
            next(fh)
            for line in fh:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in owner:  # 0A: LISTEN
                    found.setdefault(owner[cols[9]], []).append(_decode_addr(cols[1]))
    return found


def _tail(path: pathlib.Path, lines: int = 60) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        return f"({exc})"
    return "\n".join(text[-lines:])


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        args = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        main = [a for a in args if a.startswith((b"org.apache.spark.", b"pyspark."))]
        return (main[0] if main else args[0]).decode(errors="replace")
    return "?"


@dataclass
class StandaloneCluster:
    """A running master and worker; see :func:`standalone_cluster`."""

    root: pathlib.Path
    master_url: str
    ui_url: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    listeners: dict[int, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    _files: list[IO[bytes]] = field(default_factory=list)

    @property
    def logs(self) -> pathlib.Path:
        return self.root / "logs"

    def state(self) -> dict[str, Any]:
        """The master's ``/json``: workers, running and completed applications."""
        with urllib.request.urlopen(f"{self.ui_url}/json", timeout=5) as resp:
            data: dict[str, Any] = json.load(resp)
        return data

    def start(self, name: str, args: Sequence[str]) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        self._files.append(log)
        self.procs[name] = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args], stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.root,
            start_new_session=True,  # its own process group, stopped as a whole by its PID
        )

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"Spark {name} exited with {proc.returncode}")

    def sample_listeners(self, *extra_groups: int) -> None:
        """Record what every process of the cluster's (and ``extra_groups``') process
        groups listens on; ``exposed()`` lists what is not on 127.0.0.1."""
        pids = [pid for pgid in [p.pid for p in self.procs.values()] + list(extra_groups)
                for pid in group_members(pgid)]
        for pid, addresses in listening(pids).items():
            known = self.listeners.get(pid, (_command(pid), ()))
            self.listeners[pid] = (known[0], tuple(sorted({*known[1], *addresses})))

    def exposed(self) -> list[str]:
        return [f"{cmd} (pid {pid}) on {a}" for pid, (cmd, addresses) in self.listeners.items()
                for a in addresses if a.rsplit(":", 1)[0] not in LOOPBACK_FORMS]

    def submit(self, name: str, app: Sequence[str], *, conf: Mapping[str, str] | None = None,
               timeout: float = 240.0, poll: Callable[[int], None] | None = None,
               ) -> subprocess.CompletedProcess[str]:
        """``spark-submit --master spark://... --conf k=v... app...`` in client mode (the
        only mode standalone has for Python), in its own process group, killed on timeout.
        ``poll(pgid)`` is called every 0.25 s while it runs. Output: ``logs/<name>.{out,err}``
        (the Python driver's stderr lands in stdout: spark-submit merges them)."""
        settings = {
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            "spark.ui.enabled": "false",
            "spark.pyspark.python": PYTHON,
            "spark.pyspark.driver.python": PYTHON,
            **(conf or {}),
        }
        cmd = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.master_url,
               "--deploy-mode", "client", "--name", name]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += list(app)
        out_path, err_path = self.logs / f"{name}.out", self.logs / f"{name}.err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=self.env, cwd=self.root, start_new_session=True)
            deadline = time.monotonic() + timeout
            try:
                while proc.poll() is None and time.monotonic() < deadline:
                    if poll is not None:
                        poll(proc.pid)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.25)
                if proc.poll() is None:
                    raise TimeoutError(f"spark-submit {name} still running after {timeout:.0f} s")
            finally:
                _stop_group(proc, grace_s=2.0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out_path.read_text(errors="replace"),
                                           err_path.read_text(errors="replace"))

    def report(self) -> str:
        """The tail of every log: daemons, spark-submit runs, executors."""
        parts = [f"listening: {self.listeners}"]
        for path in sorted(self.logs.iterdir()) + sorted((self.root / "work").glob("app-*/*/std*")):
            parts.append(f"----- {path.relative_to(self.root)}\n{_tail(path)}")
        return "\n".join(parts)

    def stop(self) -> None:
        for name in ("worker", "master"):  # the worker first: it stops its executors
            proc = self.procs.get(name)
            if proc is not None:
                _stop_group(proc)
        for fh in self._files:
            fh.close()


def _spark_env(root: pathlib.Path) -> dict[str, str]:
    """This process's environment without anyone's Spark settings, plus ours."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPARK_", "PYSPARK_")) and k not in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")}
    return {
        **env,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(root / "conf"),  # empty: no spark-env.sh, no spark-defaults.conf
        "SPARK_LOG_DIR": str(root / "logs"),
        "SPARK_LOCAL_IP": LOOPBACK,  # web UIs, block managers and executors bind here
        "SPARK_LOCAL_HOSTNAME": LOOPBACK,
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": JVM_OPTS,
        "PYSPARK_PYTHON": PYTHON,
        "PYSPARK_DRIVER_PYTHON": PYTHON,
        "PYTHONWARNINGS": "ignore",
    }


@contextlib.contextmanager
def standalone_cluster(root: pathlib.Path, *, cores: int = 1, memory: str = "1g",
                       start_timeout_s: float = 60.0) -> Iterator[StandaloneCluster]:
    """A Spark standalone master and one worker on 127.0.0.1 from the installed PySpark.

    Yields once the worker has registered with the master. On leaving, both are stopped
    by PID; if the body raised, the tail of every log is printed first (pytest shows it
    with the failure). Logs stay in ``root/logs`` and ``root/work`` (executors).
    """
    for sub in ("logs", "work", "conf"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    master_port, master_ui, worker_port, worker_ui = (free_port() for _ in range(4))
    # No REST submission server (it would listen on 6066); read by the master only.
    (root / "master.properties").write_text("spark.master.rest.enabled false\n")
    cluster = StandaloneCluster(root=root, master_url=f"spark://{LOOPBACK}:{master_port}",
                                ui_url=f"http://{LOOPBACK}:{master_ui}", env=_spark_env(root))
    try:
        cluster.start("master", [
            "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(master_port),
            "--webui-port", str(master_ui), "--properties-file", str(root / "master.properties"),
        ])
        cluster.start("worker", [
            "org.apache.spark.deploy.worker.Worker", cluster.master_url, "--host", LOOPBACK,
            "--port", str(worker_port), "--webui-port", str(worker_ui), "--cores", str(cores),
            "--memory", memory, "--work-dir", str(root / "work"),
        ])
        deadline = time.monotonic() + start_timeout_s
        while True:
            cluster.check_alive()
            with contextlib.suppress(OSError, ValueError):
                if cluster.state().get("aliveworkers", 0) >= 1:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no worker registered with {cluster.master_url} in {start_timeout_s:.0f} s")
            time.sleep(0.25)
        yield cluster
    except BaseException:
        print(f"Spark standalone cluster in {root}:\n{cluster.report()}")
        raise
    finally:
        cluster.stop()


# --------------------------------------------------------------------------- the test

JOB_PY = pathlib.Path(job.__file__).resolve()  # spark_jobs/src/understudy_spark/job.py

# 3 groups, 1 day at 60 s, with everything the synthesiser injects (gaps, controller
# restarts, pod label churn, duplicates, staleness markers, two-reader time).
SPEC = SynthSpec(groups=3, days=1, step_s=60, incidents=5, seed=23, gaps=2, controller_restarts=1,
                 violation_fraction=0.5)

# Kilobytes of input: the settings conftest.TEST_CONF gives the local session.
SMALL_INPUT_CONF = {
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "2",
    "spark.sql.catalogImplementation": "in-memory",
    "spark.shuffle.compress": "false",
    "spark.rdd.compress": "false",
    "spark.sql.files.openCostInBytes": "1048576",
    "spark.driver.memory": "1g",
    "spark.executor.memory": "1g",
    "spark.driver.extraJavaOptions": JVM_OPTS,
    "spark.executor.extraJavaOptions": JVM_OPTS,
}

PROBE = '''\
import json, sys
from pyspark.sql import SparkSession

def where(_):
    import understudy_broker, understudy_spark
    return (sys.executable, sys.prefix, understudy_spark.__file__, understudy_broker.__file__)

spark = SparkSession.builder.getOrCreate()
print(json.dumps(spark.sparkContext.parallelize(range(2), 2).map(where).distinct().collect()))
spark.stop()
'''


def _rows(path: pathlib.Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_sla_job_under_spark_submit_on_a_standalone_cluster(spark: Any, tmp_path: pathlib.Path) -> None:
    t0 = time.monotonic()
    exports = tmp_path / "exports"
    synthesize(SPEC, out=exports, formats=("dump",))
    truth = json.loads((exports / "ground_truth.json").read_text(encoding="utf-8"))
    args = ["--input", str(exports / "dump"), "--step", f"{SPEC.step_s}s", "--shuffle-partitions", "2"]
    job.quiet_pandas_warning()

    def run_local() -> tuple[job.JobResult, float]:
        t = time.monotonic()
        result = job.run(spark, job.JobConfig(inputs=(str(exports / "dump"),), out=str(tmp_path / "local"),
                                              step_s=SPEC.step_s), progress=lambda _msg: None)
        return result, time.monotonic() - t

    # The local[*] run shares the 2 cores with the cluster's start and the probe, which
    # mostly wait for JVMs to start: run it alongside them in this process's session.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        local_run = pool.submit(run_local)
        t = time.monotonic()
        with standalone_cluster(tmp_path / "cluster") as cluster:
            started_s = time.monotonic() - t
            cluster.sample_listeners()
            assert {cmd for cmd, _ in cluster.listeners.values()} == {
                "org.apache.spark.deploy.master.Master", "org.apache.spark.deploy.worker.Worker"}

            if os.environ.get("UNDERSTUDY_SPARK_PROBE"):  # where executors run Python (~15 s)
                (cluster.root / "probe.py").write_text(PROBE)
                probe = cluster.submit("probe", [str(cluster.root / "probe.py")], conf=SMALL_INPUT_CONF,
                                       timeout=120)
                assert probe.returncode == 0, probe.stdout[-4000:] + probe.stderr[-4000:]
                seen = [tuple(s) for s in json.loads(probe.stdout.strip().splitlines()[-1])]
                assert seen == [(PYTHON, sys.prefix, understudy_spark.__file__, understudy_broker.__file__)]

            out = tmp_path / "cluster-out"
            t = time.monotonic()
            submitted = cluster.submit("sla", [str(JOB_PY), *args, "--out", str(out)], conf=SMALL_INPUT_CONF,
                                       poll=cluster.sample_listeners)
            submit_s = time.monotonic() - t
            assert submitted.returncode == 0, submitted.stdout[-4000:] + submitted.stderr[-4000:]
            local, local_s = local_run.result(timeout=300)
            assert local.incidents == len(truth["incidents"]) > 0
            assert f"{local.incidents} incident(s) (0 still open) in {SPEC.groups} group(s)" in submitted.stdout
            assert "[sla" in submitted.stdout  # the job's stage lines (spark-submit merges stderr)

            # It ran on this cluster: the master lists it, its driver and executor listened.
            apps = [a["name"] for a in cluster.state().get("completedapps", [])]
            assert "understudy-sla" in apps, apps
            commands = {cmd for cmd, _ in cluster.listeners.values()}
            assert {"org.apache.spark.deploy.SparkSubmit",
                    "org.apache.spark.executor.CoarseGrainedExecutorBackend"} <= commands, commands
            assert cluster.exposed() == []
            # The job's executor ran Python (the dump reader's series-head table) with this
            # environment's packages, or the job would have failed.
            logs = [p.read_text(errors="replace") for p in sorted((cluster.root / "work").glob("app-*/0/stderr"))]
            python_on_executor = "PythonRunner" in logs[-1] if logs else False
            assert python_on_executor, logs[-1][-2000:] if logs else "no executor log"

            for table in ("incidents.csv", "daily.csv"):
                assert _rows(out / table) == _rows(tmp_path / "local" / table), table
            assert len(_rows(out / "incidents.csv")) == len(truth["incidents"])
            assert (out / "report.html").is_file()
            assert (out / "parquet" / "incidents").is_dir()

    total_s = time.monotonic() - t0
    print(f"\nstandalone cluster up (worker registered) in {started_s:.1f} s; SLA job via spark-submit {submit_s:.1f} s; the same job in the local[*] "
          f"session {local_s:.1f} s (alongside); test {total_s:.1f} s; the job ran Python on the "
          f"executor: {python_on_executor}")
