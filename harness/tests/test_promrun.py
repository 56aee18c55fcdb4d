"""promrun: the scrape config, the export windows and API answers (pure), and a real
Prometheus from the Debian package scraping a small exporter on 127.0.0.1: both export
forms carry the same samples, and every kind of failure gets a clear error with nothing
left running."""

from __future__ import annotations

import http.server
import itertools
import json
import math
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import yaml

from understudy_harness import promrun
from understudy_operator.local.plan import plan_cluster

needs_prometheus = pytest.mark.skipif(
    bool(promrun.missing()), reason="needs the Debian 'prometheus' package (prometheus and promtool)"
)


# ------------------------------------------------------------------------------ pure


@pytest.mark.parametrize(("seconds", "text"), [(1.0, "1s"), (15, "15s"), (0.25, "250ms"), (1.5, "1500ms")])
def test_durations_are_prometheus_durations(seconds: float, text: str) -> None:
    assert promrun.duration(seconds) == text


def test_a_zero_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        promrun.duration(0)


def test_the_scrape_config_honours_the_contract_labels_and_labels_each_target() -> None:
    targets = [promrun.Target("127.0.0.1:9001", {"group": "g1", "broker": "g1-0"}),
               promrun.Target("127.0.0.1:9002", {"component": "controller"})]
    doc = yaml.safe_load(promrun.scrape_config(targets, interval_s=0.5))
    assert doc["global"]["scrape_interval"] == "500ms"
    assert doc["global"]["scrape_timeout"] == "400ms"
    (job,) = doc["scrape_configs"]
    assert job["honor_labels"] is True
    assert job["static_configs"] == [
        {"targets": ["127.0.0.1:9001"], "labels": {"group": "g1", "broker": "g1-0"}},
        {"targets": ["127.0.0.1:9002"], "labels": {"component": "controller"}},
    ]


def test_nothing_to_scrape_is_refused() -> None:
    with pytest.raises(ValueError, match="no targets"):
        promrun.scrape_config([], interval_s=1)


def test_every_broker_and_the_controller_of_a_local_cluster_are_targets(tmp_path: pathlib.Path) -> None:
    ports = itertools.count(20000)
    plan = plan_cluster(directory=tmp_path, groups=2, slaves=1, sync=True, port=lambda: next(ports),
                        zk_port=2181)
    targets = promrun.cluster_targets(plan)
    brokers = {t.labels.get("broker"): t for t in targets if "broker" in t.labels}
    assert sorted(brokers) == ["g1-0", "g1-1", "g2-0", "g2-1"]
    assert brokers["g2-1"].labels["group"] == "g2"
    assert brokers["g2-1"].address == f"127.0.0.1:{plan.process('g2-1').http_port}"
    assert [t.address for t in targets if t.labels.get("component") == "controller"] == [
        f"127.0.0.1:{plan.controller_http_port}"
    ]


def test_export_windows_evaluate_just_before_each_bucket_ends() -> None:
    # buckets [10, 11) ... [19, 20) are complete inside [10.2, 20.5]
    assert promrun.range_windows(start=10.2, end=20.5, step_s=1) == [(10.999, 19.999)]
    assert promrun.range_windows(start=0, end=25_000, step_s=1, max_points=10_000) == [
        (0.999, 9999.999), (10000.999, 19999.999), (20000.999, 24999.999)]
    assert promrun.range_windows(start=0.0, end=2.0, step_s=0.25)[0] == (0.249, 1.999)
    assert promrun.range_windows(start=10.5, end=10.6, step_s=1) == []


def test_a_backwards_range_is_refused() -> None:
    with pytest.raises(ValueError, match="bad range"):
        promrun.range_windows(start=5, end=4, step_s=1)


@pytest.mark.parametrize(("body", "message"), [
    (b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}', "parse error at char 3"),
    (b"<html>proxy error</html>", "not JSON"),
    (b'["success"]', "unexpected answer"),
])
def test_failed_api_answers_name_the_problem(body: bytes, message: str) -> None:
    with pytest.raises(promrun.PrometheusError, match=re.escape(message)):
        promrun.api_data(body, what="query")


# ------------------------------------------------------------------ real Prometheus


class _Exporter(http.server.BaseHTTPRequestHandler):
    """Serves a permission gauge that counts scrapes (so every sample is distinct)."""

    scrapes = itertools.count()
    served = -1  # the value of the latest answer

    def do_GET(self) -> None:
        n = next(self.scrapes)
        type(self).served = max(type(self).served, n)
        body = (f'understudy_broker_permission{{group="g1",broker="g1-0",role="master"}} {n}\n'
                'understudy_other_metric 1\n').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def prometheus(tmp_path: pathlib.Path, exporter: str) -> Iterator[promrun.PrometheusServer]:
    server = promrun.PrometheusServer(tmp_path / "prom", [promrun.Target(exporter, {"group": "g1"})], interval_s=0.25)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.integration
@needs_prometheus
def test_both_export_forms_carry_the_same_scrapes(prometheus: promrun.PrometheusServer,
                                                  tmp_path: pathlib.Path) -> None:
    prometheus.wait_targets_up(timeout=30)
    time.sleep(1.5)
    export = prometheus.export(tmp_path / "export")
    assert export.series == 2  # the selector keeps the contract's metrics and up only...
    (qr_file,) = export.query_range
    (series,) = [s for s in json.loads(qr_file.read_text())["data"]["result"]
                 if s["metric"]["__name__"] == "understudy_broker_permission"]
    step = prometheus.interval_s
    from_qr = {math.floor(float(t) / step): v for t, v in series["values"]}
    from_dump = {}
    for line in export.tsdb_dump.read_text().splitlines():
        assert "understudy_other_metric" not in line  # ...in the dump as well
        if line.startswith('{__name__="understudy_broker_permission"'):
            _labels, value, t_ms = line.rsplit(" ", 2)
            from_dump[math.floor(int(t_ms) / 1000 / step)] = value
    assert len(from_dump) >= 4
    # the same sample lands in the same bucket in both forms (query_range evaluates 1 ms
    # before each bucket's end); the last bucket may be complete in only one of them
    common = sorted(set(from_qr) & set(from_dump))
    assert len(common) >= len(from_dump) - 1
    assert all(from_qr[b] == from_dump[b] for b in common)
    assert not list((prometheus.data_dir / "snapshots").iterdir()), "the snapshot is removed after the dump"
    pid = prometheus.pid
    assert pid is not None
    prometheus.stop()
    assert _gone(pid)


@pytest.mark.integration
@needs_prometheus
def test_an_export_holds_the_state_at_the_call(prometheus: promrun.PrometheusServer, tmp_path: pathlib.Path) -> None:
    """A drill exports right after its last recovery: whatever a target shows at the call
    must be in the query_range export too, not only in the dump (which keeps raw
    samples), or the last incident reads as open there."""
    prometheus.wait_targets_up(timeout=30)
    time.sleep(1.0)
    before_call = _Exporter.served
    export = prometheus.export(tmp_path / "export")
    values = [float(v) for qr_file in export.query_range
              for s in json.loads(qr_file.read_text())["data"]["result"]
              if s["metric"]["__name__"] == "understudy_broker_permission" for _t, v in s["values"]]
    assert max(values) > before_call, (max(values), before_call)


@pytest.mark.integration
@needs_prometheus
def test_a_bad_query_gets_prometheus_own_message(prometheus: promrun.PrometheusServer) -> None:
    with pytest.raises(promrun.PrometheusError, match="parse error"):
        prometheus.query_range(promql="sum(", start=time.time() - 5, end=time.time(), step_s=1)


@pytest.mark.integration
@needs_prometheus
def test_a_port_in_use_is_a_clear_error_and_leaves_nothing_running(tmp_path: pathlib.Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = promrun.PrometheusServer(tmp_path / "prom", [promrun.Target("127.0.0.1:1")],
                                          port=busy.getsockname()[1])
        with pytest.raises(promrun.PrometheusError, match="exited"):
            server.start(timeout=30)
    assert server.process is None
    assert not (tmp_path / "prom" / "prometheus.pid").exists()


@pytest.mark.integration
@needs_prometheus
def test_dumping_something_that_is_not_a_tsdb_names_it(tmp_path: pathlib.Path) -> None:
    with pytest.raises(promrun.PrometheusError, match="promtool tsdb dump"):
        promrun.dump_tsdb(tmp_path / "nothing-here", tmp_path / "out.txt", match=promrun.selector(),
                          min_time_ms=0, max_time_ms=1)


# ------------------------------------------------------------------- drill options

def _understudy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from understudy_broker.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


def test_drill_prometheus_without_the_package_exits_3_naming_it_and_starts_nothing(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "empty-path")}
    done = _understudy("drill", "--cycles", "0", "--slaves", "0", "--prometheus", "--dir", str(tmp_path / "d"), env=env)
    assert done.returncode == 3, done.stderr
    assert "prometheus" in done.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("value", ["0", "-1", "61", "fast"])
def test_a_bad_scrape_interval_exits_2(value: str) -> None:
    done = _understudy("drill", "--prometheus", "--scrape-interval", value)
    assert done.returncode == 2
    assert "--scrape-interval" in done.stderr
