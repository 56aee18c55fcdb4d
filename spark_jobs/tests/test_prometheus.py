"""The readers against real Prometheus output: a real Prometheus scrapes a small exporter
on 127.0.0.1 that plays a scripted failover with the contract's metric names; the data is
exported through ``/api/v1/query_range`` and ``promtool tsdb dump`` and the job must find
the failover at the scripted times, within a scrape interval.

This is the shape of the issue's integration test; once the HA drill exists, the
exporter is replaced by the drill's cluster and the script by the drill's own timings.
"""

from __future__ import annotations

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

from understudy_spark import readers, transforms

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


@pytest.fixture
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


@pytest.fixture
def prometheus(tmp_path: pathlib.Path, exporter: tuple[int, float]) -> Iterator[dict[str, Any]]:
    target_port, wall_start = exporter
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
         f"--web.listen-address=127.0.0.1:{port}"],
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
        yield {"url": url, "data": data, "proc": proc, "wall_start": wall_start}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def test_failover_found_in_real_prometheus_exports(spark: Any, prometheus: dict[str, Any],
                                                   tmp_path: pathlib.Path) -> None:
    wall_start = prometheus["wall_start"]
    time.sleep(max(0.0, wall_start + RUN_S - time.time()))
    query = urllib.parse.urlencode({
        "query": '{__name__=~"understudy_group_mode|understudy_broker_permission"}',
        "start": f"{wall_start - 2:.3f}", "end": f"{time.time():.3f}", "step": f"{SCRAPE_S:g}s",
    })
    with urllib.request.urlopen(f"{prometheus['url']}/api/v1/query_range?{query}", timeout=10) as r:
        (tmp_path / "export.json").write_bytes(r.read())
    proc = prometheus["proc"]
    os.killpg(proc.pid, signal.SIGTERM)  # flush and release the TSDB before dumping it
    proc.wait(timeout=20)
    dump = subprocess.run(["promtool", "tsdb", "dump", str(prometheus["data"])],
                          capture_output=True, text=True, timeout=60, check=True)
    (tmp_path / "export.txt").write_text(dump.stdout)

    scripted = {name: dt.datetime.fromtimestamp(wall_start + SCRIPT[i][0], tz=dt.UTC).replace(tzinfo=None)
                for name, i in (("master_lost_at", 1), ("reads_restored_at", 2), ("master_back_at", 3),
                                ("normal_at", 5))}
    tolerance = dt.timedelta(seconds=2 * SCRAPE_S)  # scrape phase + bucket edge
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
