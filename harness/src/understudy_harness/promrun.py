"""A private Prometheus that records a local cluster, and its exports for the SLA job.

Why this module exists: the SLA job (:mod:`understudy_spark`) is only believable if it
finds, in what a real Prometheus recorded, the failovers a drill measured by itself. So
the drill (``understudy drill --prometheus``), ``make demo`` and the integration test
start a Prometheus from the Debian package on 127.0.0.1, scrape every broker and the
controller of the local cluster at a short interval, and export what it stored in the two
forms the job reads: ``/api/v1/query_range`` JSON (matrix) and ``promtool tsdb dump`` text
of an admin-API snapshot.

Decisions are pure (:func:`scrape_config`, :func:`cluster_targets`, and from
:mod:`understudy_spark.promapi`, which ``understudy sla report --prometheus`` reads with:
:func:`range_windows`, :func:`selector`, :func:`api_data`); :class:`PrometheusServer`
does the I/O. The server is a child process in its own process group, stopped by its PID
(SIGTERM, then SIGKILL), never by name.

Time alignment of the ``query_range`` export (the planning lives in ``promapi``): the
job cuts time into buckets ``floor(t / step)``. Evaluating at bucket *starts* would show a
sample scraped inside bucket ``k`` only at ``k + 1`` (PromQL takes the latest sample at or
before the evaluation time), one step later than the raw samples in the dump. So
evaluation times are placed 1 ms before each bucket's end: both exports put a scrape into
the same bucket.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from understudy_operator.local.plan import ClusterPlan
from understudy_operator.local.ports import free_port
from understudy_operator.local.procs import stop_group
from understudy_spark.promapi import SLA_METRICS as CONTRACT_METRICS
from understudy_spark.promapi import (
    PrometheusError,
    api_data,
    check_matrix,
    error_detail,
    range_windows,
    selector,
)

# The pure planning and answer checks are promapi's; these names stay importable from here.
__all__ = [
    "CONTRACT_METRICS", "JOB", "Export", "PrometheusError", "PrometheusServer", "Target", "api_data",
    "cluster_targets", "dump_tsdb", "duration", "missing", "range_windows", "record_cluster",
    "scrape_config", "selector",
]

JOB = "understudy"


@dataclass(frozen=True, slots=True)
class Target:
    """One scrape target (``host:port`` serving ``/metrics``) and its target labels."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Export:
    """What :meth:`PrometheusServer.export` wrote."""

    query_range: tuple[Path, ...]
    tsdb_dump: Path
    start: float
    end: float
    step_s: float
    series: int
    points: int
    dump_lines: int

    def to_json(self) -> dict[str, Any]:
        return {
            "query_range": [str(p) for p in self.query_range],
            "tsdb_dump": str(self.tsdb_dump),
            "start": self.start,
            "end": self.end,
            "step_s": self.step_s,
            "series": self.series,
            "points": self.points,
            "dump_lines": self.dump_lines,
        }


def missing() -> list[str]:
    """The executables this module needs and this machine lacks."""
    return [exe for exe in ("prometheus", "promtool") if shutil.which(exe) is None]


def duration(seconds: float) -> str:
    """A Prometheus duration (``1s``, ``250ms``) for ``seconds`` (whole milliseconds)."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"a scrape interval must be positive, got {seconds!r}")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def cluster_targets(plan: ClusterPlan) -> list[Target]:
    """Every broker's and the controller's ``/metrics`` endpoint. Brokers carry
    ``group``/``broker`` target labels, so that ``up`` can be attributed (DESIGN: the job
    only uses ``up`` with those labels)."""
    targets = [
        Target(f"127.0.0.1:{p.http_port}", {"group": p.group or "", "broker": p.name})
        for p in plan.brokers
        if p.http_port is not None
    ]
    if plan.controller_http_port is not None:
        targets.append(Target(f"127.0.0.1:{plan.controller_http_port}", {"component": "controller"}))
    return targets


def scrape_config(targets: Sequence[Target], *, interval_s: float, job: str = JOB) -> str:
    """The ``prometheus.yml`` for ``targets``. ``honor_labels``: the contract's own
    ``group``/``broker`` labels win over target labels. The timeout is 80 % of the
    interval, so a frozen target yields a failed scrape (and staleness) every interval."""
    if not targets:
        raise ValueError("nothing to scrape: no targets")
    timeout_s = min(10.0, max(0.001, interval_s * 0.8))
    doc = {
        "global": {"scrape_interval": duration(interval_s), "scrape_timeout": duration(timeout_s),
                   "evaluation_interval": "1m"},
        "scrape_configs": [
            {
                "job_name": job,
                "honor_labels": True,
                "static_configs": [{"targets": [t.address], "labels": dict(t.labels)} for t in targets],
            }
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class PrometheusServer:
    """One private Prometheus scraping ``targets`` every ``interval_s``.

    ``directory`` holds ``prometheus.yml``, ``data/`` (the TSDB), ``prometheus.log``,
    ``prometheus.pid`` and the exports.
    """

    directory: Path
    targets: Sequence[Target]
    interval_s: float = 1.0
    host: str = "127.0.0.1"
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0  # wall time (s) when it started: where exports begin by default

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    # ----------------------------------------------------------------- lifecycle

    def start(self, *, timeout: float = 30.0) -> str:
        """Start Prometheus and wait until it is ready; returns its URL."""
        lacking = missing()
        if lacking:
            raise PrometheusError(
                f"needs the Debian 'prometheus' package (missing: {', '.join(lacking)}); run 'make setup'"
            )
        if self.port == 0:
            self.port = free_port(self.host)
        self.directory = self.directory.resolve()  # Prometheus runs with cwd = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "prometheus.yml"
        config.write_text(scrape_config(self.targets, interval_s=self.interval_s))
        cmd = [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address={self.host}:{self.port}",
            "--web.enable-admin-api",
            "--log.level=warn",
        ]
        log = (self.directory / "prometheus.log").open("ab")
        try:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.directory, start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()
        (self.directory / "prometheus.pid").write_text(f"{self.process.pid}\n")
        self.started_at = time.time()
        try:
            self._wait_ready(timeout)
        except BaseException:  # whatever stops the wait, nothing is left running
            self.stop()
            raise
        return self.url

    def _wait_ready(self, timeout: float) -> None:
        proc = self.process
        deadline = time.monotonic() + timeout
        while proc is not None and time.monotonic() < deadline:
            if proc.poll() is not None:
                raise PrometheusError(f"Prometheus exited with {proc.returncode}: {self._log_tail()}")
            with contextlib.suppress(OSError, PrometheusError):  # 503 while it starts
                if self._get("/-/ready", timeout=1.0) is not None:
                    return
            time.sleep(0.05)
        raise PrometheusError(f"Prometheus was not ready within {timeout:.0f}s: {self._log_tail()}")

    def stop(self, *, timeout: float = 20.0) -> None:
        """Stop Prometheus by PID (its process group): SIGTERM, SIGKILL after ``timeout``."""
        proc = self.process
        if proc is None:
            return
        stop_group(proc, timeout=timeout)
        self.process = None
        with contextlib.suppress(OSError):
            (self.directory / "prometheus.pid").unlink()

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --------------------------------------------------------------------- HTTP

    def _get(self, path: str, *, timeout: float = 10.0, method: str = "GET") -> bytes | None:
        req = urllib.request.Request(self.url + path, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return bytes(resp.read()) if resp.status == 200 else None
        except urllib.error.HTTPError as exc:
            detail = error_detail(exc.read())
            raise PrometheusError(f"{path.split('?')[0]}: HTTP {exc.code}: {detail}", status=exc.code) from None

    def query(self, promql: str, *, at: float | None = None) -> Any:
        """An instant query; returns the API's ``data``."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        body = self._get("/api/v1/query?" + urllib.parse.urlencode(params))
        if body is None:
            raise PrometheusError(f"query {promql!r}: no answer")
        return api_data(body, what=f"query {promql!r}")

    def _scalar(self, promql: str) -> float | None:
        data = self.query(promql)
        result = data.get("result") if isinstance(data, dict) else None
        if not result:
            return None
        return float(result[0]["value"][1])

    def wait_targets_up(self, *, timeout: float = 30.0) -> None:
        """Wait until every target has been scraped successfully at least once."""
        want = len(self.targets)
        deadline = time.monotonic() + timeout
        while True:
            up = self._scalar(f'count(up{{job="{JOB}"}} == 1)')
            if up is not None and int(up) >= want:
                return
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"only {int(up or 0)} of {want} targets answered Prometheus within {timeout:.0f}s "
                    f"(see {self.url}/targets)"
                )
            time.sleep(min(0.2, self.interval_s / 2))

    def wait_scraped_after(self, t: float, *, timeout: float = 30.0) -> None:
        """Wait until every target has been scraped (successfully or not) after wall time ``t``."""
        deadline = time.monotonic() + timeout
        while True:
            oldest = self._scalar(f'min(timestamp(up{{job="{JOB}"}}))')
            if oldest is not None and oldest >= t:
                return
            if time.monotonic() > deadline:
                raise PrometheusError(f"targets were not scraped after {t:.3f} within {timeout:.0f}s")
            time.sleep(min(0.2, self.interval_s / 2))

    # ------------------------------------------------------------------- exports

    def query_range(self, *, promql: str, start: float, end: float, step_s: float) -> bytes:
        """One ``/api/v1/query_range`` answer (raw JSON, checked to be a matrix)."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        what = f"query_range {promql!r}"
        body = self._get("/api/v1/query_range?" + urllib.parse.urlencode(params), timeout=60.0)
        if body is None:
            raise PrometheusError(f"{what}: no answer")
        check_matrix(body, what=what)
        return body

    def snapshot(self) -> Path:
        """An admin-API snapshot of the TSDB (head included), ready for ``promtool tsdb
        dump``: the snapshot gets the empty ``wal/`` folder promtool expects."""
        body = self._get("/api/v1/admin/tsdb/snapshot", method="POST", timeout=60.0)
        if body is None:
            raise PrometheusError("snapshot: no answer (is --web.enable-admin-api set?)")
        data = api_data(body, what="snapshot")
        name = data.get("name") if isinstance(data, dict) else None
        if not isinstance(name, str) or not name or "/" in name:
            raise PrometheusError(f"snapshot: unexpected answer {data!r}")
        path = self.data_dir / "snapshots" / name
        (path / "wal").mkdir(parents=True, exist_ok=True)
        return path

    def export(
        self, out: Path, *, start: float | None = None, end: float | None = None,
        metrics: Sequence[str] = CONTRACT_METRICS,
    ) -> Export:  # fmt: skip
        """Export ``metrics`` from ``start`` (wall seconds; default: when the server
        started) to ``end`` as ``query_range-NNN.json`` and ``tsdb-dump.txt`` in ``out``.

        ``end`` defaults to two scrape intervals after the call, once every target has
        been scraped after it. The state at the call is then in a complete bucket of
        both exports. ``query_range`` keeps only whole buckets before ``end``. A state
        reached just before the call can be first scraped up to one interval later, and
        its bucket ends up to one interval after that. With ``end = now``, the last
        NORMAL of a drill that exported right after its recovery could be missing from
        ``query_range``: an open incident there, closed in the dump."""
        if start is None:
            start = self.started_at
        if end is None:
            end = time.time() + 2 * self.interval_s
            time.sleep(max(0.0, end - time.time()))
            self.wait_scraped_after(end, timeout=max(10.0, 5 * self.interval_s))
        windows = range_windows(start=start, end=end, step_s=self.interval_s)
        if not windows:
            raise PrometheusError(f"nothing to export: {end - start:.3f} s is less than one scrape interval")
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("query_range-*.json"):  # an earlier export's chunks
            stale.unlink()
        promql = selector(metrics)
        files: list[Path] = []
        series: set[str] = set()
        points = 0
        for n, (first, last) in enumerate(windows):
            body = self.query_range(promql=promql, start=first, end=last, step_s=self.interval_s)
            path = out / f"query_range-{n:03d}.json"
            path.write_bytes(body)
            files.append(path)
            for s in json.loads(body)["data"]["result"]:
                series.add(json.dumps(s["metric"], sort_keys=True))
                points += len(s.get("values", []))
        snap = self.snapshot()
        dump = out / "tsdb-dump.txt"
        dump_lines = dump_tsdb(
            snap, dump, match=promql, min_time_ms=math.floor(start * 1000), max_time_ms=math.ceil(end * 1000)
        )
        shutil.rmtree(snap, ignore_errors=True)
        return Export(
            query_range=tuple(files), tsdb_dump=dump, start=start, end=end, step_s=self.interval_s,
            series=len(series), points=points, dump_lines=dump_lines,
        )  # fmt: skip

    def _log_tail(self, lines: int = 10) -> str:
        try:
            text = (self.directory / "prometheus.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"


def dump_tsdb(db: Path, out: Path, *, match: str, min_time_ms: int, max_time_ms: int) -> int:
    """``promtool tsdb dump`` of ``db`` (a data dir or a snapshot with a ``wal/``) into
    ``out``; returns the number of lines written."""
    cmd = [
        "promtool", "tsdb", "dump", f"--match={match}",
        f"--min-time={min_time_ms}", f"--max-time={max_time_ms}", str(db),
    ]  # fmt: skip
    with out.open("wb") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                              timeout=300, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise PrometheusError(
            f"promtool tsdb dump {db} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-500:]}"
        )
    with out.open("rb") as fh:
        return sum(1 for _ in fh)


def record_cluster(plan: ClusterPlan, *, interval_s: float, directory: Path | None = None) -> PrometheusServer:
    """Start a Prometheus scraping every process of ``plan`` and return once each target
    has answered a scrape. Stops it again if that does not happen. The TSDB starts empty:
    a previous drill's data in the same cluster directory is removed (``local up`` wipes
    the cluster's own data the same way)."""
    server = PrometheusServer(directory or plan.dir / "prometheus", cluster_targets(plan), interval_s=interval_s)
    shutil.rmtree(server.data_dir, ignore_errors=True)
    server.start()
    try:
        server.wait_targets_up(timeout=max(30.0, 10 * interval_s))
    except BaseException:
        server.stop()
        raise
    return server
