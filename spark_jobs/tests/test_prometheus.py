"""The readers against real Prometheus output: a real Prometheus scrapes a small exporter
on 127.0.0.1 that plays a scripted failover with the contract's metric names; the data is
exported through ``/api/v1/query_range`` and ``promtool tsdb dump`` and the job must find
the failover at the scripted times, within a scrape interval. ``sla report --prometheus``
reads the same Prometheus over its HTTP API and must find the scripted incident from
exactly the data ``sla export`` wrote, the same incidents as the job's path (what ``sla
report --input`` runs) over those files.

One recording (module fixtures, ~22 s of scripted failover) serves both tests; the
server runs until the module is done and is stopped by its PID.

This is the shape of the issue's integration test; once the HA drill exists, the
exporter is replaced by the drill's cluster and the script by the drill's own timings.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import http.server
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from understudy_spark import cli, job, promapi, readers, transforms

pytestmark = [
    pytest.mark.spark,
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                       reason="needs the Debian 'prometheus' package (prometheus and promtool)"),
]

SCRAPE_S = 1.0
# (seconds since start, mode, master permission or None = master process gone, slave permission)
SCRIPT = [
    (0.0, 0, 3, 0),
    (6.0, 1, None, 0),  # master dies: FENCING, nobody reads
    (9.0, 2, None, 1),  # SLAVE_CONSUME: the acting slave reads
    (13.0, 2, 0, 1),  # master back, NONE
    (15.0, 3, 0, 0),  # RECOVERING: back-sync, nobody reads
    (17.0, 0, 3, 0),  # NORMAL
]
RUN_S = 22.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Exporter(http.server.BaseHTTPRequestHandler):
    started = 0.0

    def do_GET(self) -> None:
        now = time.monotonic() - self.started
        _, mode, master, slave = [row for row in SCRIPT if row[0] <= now][-1]
        lines = [f'understudy_group_mode{{group="g1"}} {mode}']
        if master is not None:
            lines.append(f'understudy_broker_permission{{group="g1",broker="g1-0",role="master"}} {master}')
        lines.append(f'understudy_broker_permission{{group="g1",broker="g1-1",role="slave"}} {slave}')
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def exporter() -> Iterator[tuple[int, float]]:
    port = _free_port()
    _Exporter.started = time.monotonic()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield port, time.time()
    finally:
        server.shutdown()
        server.server_close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop Prometheus by its PID (its own process group): SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, exporter: tuple[int, float]) -> Iterator[dict[str, Any]]:
    """A Prometheus that has recorded the whole script (it keeps running for the tests)."""
    target_port, wall_start = exporter
    tmp_path = tmp_path_factory.mktemp("prometheus")
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE_S:g}s\n  scrape_timeout: 900ms\n"
        "scrape_configs:\n  - job_name: understudy\n    honor_labels: true\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
    )
    data = tmp_path / "tsdb"
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--web.enable-admin-api"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp_path / "prometheus.log").read_text()[-2000:]) from None
                time.sleep(0.1)
        time.sleep(max(0.0, wall_start + RUN_S - time.time()))
        yield {"url": url, "data": data, "proc": proc, "wall_start": wall_start}
    finally:
        _stop(proc)
        log.close()


def _scripted(wall_start: float) -> dict[str, dt.datetime]:
    return {name: dt.datetime.fromtimestamp(wall_start + SCRIPT[i][0], tz=dt.UTC).replace(tzinfo=None)
            for name, i in (("master_lost_at", 1), ("reads_restored_at", 2), ("master_back_at", 3),
                            ("normal_at", 5))}


TOLERANCE = dt.timedelta(seconds=2 * SCRAPE_S)  # scrape phase + bucket edge


def test_failover_found_in_real_prometheus_exports(spark: Any, prometheus: dict[str, Any],
                                                   tmp_path: pathlib.Path) -> None:
    wall_start = prometheus["wall_start"]
    query = urllib.parse.urlencode({
        "query": '{__name__=~"understudy_group_mode|understudy_broker_permission"}',
        "start": f"{wall_start - 2:.3f}", "end": f"{time.time():.3f}", "step": f"{SCRAPE_S:g}s",
    })
    with urllib.request.urlopen(f"{prometheus['url']}/api/v1/query_range?{query}", timeout=10) as r:
        (tmp_path / "export.json").write_bytes(r.read())
    # the server keeps running for the other test: dump an admin-API snapshot (head
    # included), which promtool reads once it has an empty wal/ folder
    req = urllib.request.Request(f"{prometheus['url']}/api/v1/admin/tsdb/snapshot", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        snapshot = prometheus["data"] / "snapshots" / json.loads(r.read())["data"]["name"]
    (snapshot / "wal").mkdir(exist_ok=True)
    dump = subprocess.run(["promtool", "tsdb", "dump", str(snapshot)],
                          capture_output=True, text=True, timeout=60, check=True)
    (tmp_path / "export.txt").write_text(dump.stdout)

    scripted = _scripted(wall_start)
    tolerance = TOLERANCE
    for name in ("export.json", "export.txt"):
        files = readers.list_inputs(spark, [str(tmp_path / name)])
        parsed = readers.read_parsed(spark, files)
        assert parsed.where("not ok").count() == 0, name
        states = transforms.group_states(transforms.clean_samples(readers.samples_of(parsed), step_s=SCRAPE_S))
        found = transforms.incidents(states, step_s=SCRAPE_S).collect()
        assert len(found) == 1, (name, found)
        got = found[0].asDict()
        for key, want in scripted.items():
            assert abs(got[key] - want) <= tolerance, (name, key, got[key], want)
        # unreadable: FENCING (3 s) + RECOVERING (2 s)
        assert abs(got["read_unavailable_s"] - 5.0) <= 2 * SCRAPE_S, (name, got)
    assert json.loads((tmp_path / "export.json").read_text())["data"]["resultType"] == "matrix"


def _incidents(path: pathlib.Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_sla_report_reads_prometheus_directly(spark: Any, prometheus: dict[str, Any], tmp_path: pathlib.Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``sla report --prometheus`` against the real server finds the scripted incident; what
    it read is exactly what ``sla export`` wrote, and the job's path over those exported
    files (what ``sla report --input`` runs) finds the same incidents. The report runs in
    this test's SparkSession (the command's own would cost another JVM)."""
    wall_start = prometheus["wall_start"]
    # a fixed end in the past: both commands read the very same samples
    span = ["--start", promapi.iso(wall_start - 2), "--end", promapi.iso(time.time() - 1), "--step", f"{SCRAPE_S:g}s"]
    source = ["--prometheus", prometheus["url"], *span]
    monkeypatch.setattr(cli, "open_session", lambda **_: contextlib.nullcontext(spark))
    runner = CliRunner()

    exported = runner.invoke(cli.sla, ["export", *source, "--out", str(tmp_path / "exported")])
    assert exported.exit_code == 0, exported.output
    assert "window 1/1 done" in exported.stderr
    # --out as a Hadoop URI: the fetched files go through the Hadoop FileSystem API
    direct = runner.invoke(cli.sla, ["report", *source, "--out", (tmp_path / "direct").as_uri()])
    assert direct.exit_code == 0, direct.output
    assert "1 incident(s) (0 still open) in 1 group(s)" in direct.stdout
    assert "window 1/1 done" in direct.stderr

    # what report --prometheus read is kept, and is what export wrote
    (kept,) = sorted((tmp_path / "direct" / "prometheus").glob("query_range-*.json"))
    (written,) = sorted((tmp_path / "exported").glob("query_range-*.json"))
    doc = json.loads(written.read_text())
    assert json.loads(kept.read_text())["data"] == doc["data"]
    names = {s["metric"]["__name__"] for s in doc["data"]["result"]}
    assert names == {"understudy_group_mode", "understudy_broker_permission"}  # `or` keeps the names
    times = sorted({float(t) for s in doc["data"]["result"] for t, _v in s["values"]})
    assert all(round(t * 1000) % 1000 == 999 for t in times)  # 1 ms before each bucket's end

    incidents = _incidents(tmp_path / "direct" / "incidents.csv")
    (got,) = incidents
    for key, want in _scripted(wall_start).items():
        at = dt.datetime.strptime(got[key], "%Y-%m-%dT%H:%M:%SZ")
        assert abs(at - want) <= TOLERANCE, (key, got[key], want)
    assert abs(float(got["read_unavailable_s"]) - 5.0) <= 2 * SCRAPE_S, got

    files = readers.list_inputs(spark, [str(tmp_path / "exported")])
    states, _observation = job.observed_states(spark, files, step_s=SCRAPE_S)
    from_files = transforms.incidents(states, step_s=SCRAPE_S).collect()
    columns = ("master_lost_at", "reads_restored_at", "master_back_at", "normal_at")
    assert [{c: f"{r[c]:%Y-%m-%dT%H:%M:%SZ}" for c in columns} | {"group": r["group"]} for r in from_files] == [
        {c: row[c] for c in (*columns, "group")} for row in incidents]
