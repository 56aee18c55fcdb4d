"""Reading straight from a Prometheus HTTP API (``understudy_spark.promapi``, ``sla export``
and ``sla report --prometheus``) without Spark: the planner and time parsing (pure), then
the HTTP client and the commands against a tiny ``http.server`` on 127.0.0.1 that plays
Prometheus' answers, canned errors included. The real Prometheus (scraping a local cluster
through the drill) is in ``test_drill_sla.py``."""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import http.server
import json
import pathlib
import shutil
import socket
import ssl
import subprocess
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from understudy_spark import promapi
from understudy_spark.cli import sla

NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC).timestamp()
DAY = 86_400.0


# ---------------------------------------------------------------------- planning


def _evals(windows: list[promapi.Window], step_s: float) -> list[int]:
    """Every evaluation time of ``windows`` in milliseconds, in request order."""
    step = round(step_s * 1000)
    return [round(first * 1000) + i * step for first, last in windows
            for i in range(round((last - first) * 1000) // step + 1)]


def test_evaluations_sit_1ms_before_each_bucket_end() -> None:
    # 15 s buckets; [12:00:05, 12:01:00] holds the whole buckets 12:00:15, 12:00:30, 12:00:45
    # and the one ending at 12:01:00 (evaluated at 12:00:59.999)
    start, end = NOW + 5, NOW + 60
    (window,) = promapi.range_windows(start=start, end=end, step_s=15)
    assert window == (NOW + 14.999, NOW + 59.999)
    assert promapi.window_points(window, 15) == 4
    assert promapi.window_span(window, 15) == (NOW + 0, NOW + 60)  # buckets [12:00:00, 12:01:00)
    # a time exactly at an evaluation is inside; a range inside one bucket holds nothing
    assert promapi.range_windows(start=NOW + 14.999, end=NOW + 14.999, step_s=15) == [(NOW + 14.999,) * 2]
    assert promapi.range_windows(start=NOW + 1, end=NOW + 14, step_s=15) == []
    assert promapi.range_windows(start=0.0, end=2.0, step_s=0.25)[0] == (0.249, 1.999)


def test_a_month_at_15s_is_one_window_per_utc_day() -> None:
    start = dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp()
    windows = promapi.range_windows(start=start, end=start + 30 * DAY, step_s=15, split_every_s=promapi.DAY_S)
    assert len(windows) == 30
    assert all(promapi.window_points(w, 15) == 5760 for w in windows)
    assert [promapi.iso(promapi.window_span(w, 15)[0]) for w in windows[:2]] == [
        "2026-11-01T00:00:00Z", "2026-11-02T00:00:00Z"]


def test_a_day_at_1s_is_cut_at_the_point_limit_and_at_midnight() -> None:
    start = dt.datetime(2026, 11, 1, 22, tzinfo=dt.UTC).timestamp()  # 2 h before midnight
    windows = promapi.range_windows(start=start, end=start + 26 * 3600, step_s=1, split_every_s=promapi.DAY_S)
    points = [promapi.window_points(w, 1) for w in windows]
    assert points == [7200] + [10_000] * 8 + [6400]  # 22:00-24:00, then a day in 10,000-step windows
    assert promapi.iso(windows[1][0]) == "2026-11-02T00:00:00.999Z"


@settings(max_examples=200, deadline=None)
@given(
    start_ms=st.integers(0, 3 * 86_400_000),
    steps=st.integers(0, 30_000),
    extra=st.floats(0, 0.999),
    step_ms=st.sampled_from([1, 250, 1000, 7_000, 15_000, 60_000, 86_400_000]),
    max_points=st.integers(1, promapi.POINT_LIMIT),
    by_day=st.booleans(),
)
def test_windows_cover_every_whole_bucket_once_within_the_point_limit(
    start_ms: int, steps: int, extra: float, step_ms: int, max_points: int, by_day: bool
) -> None:
    length_ms = steps * step_ms + int(extra * step_ms)
    start, end, step = start_ms / 1000, (start_ms + length_ms) / 1000, step_ms / 1000
    windows = promapi.range_windows(start=start, end=end, step_s=step, max_points=max_points,
                                    split_every_s=promapi.DAY_S if by_day else None)
    evals = _evals(windows, step)
    want = [(k + 1) * step_ms - 1 for k in range(start_ms // step_ms - 1, (start_ms + length_ms) // step_ms + 1)
            if start_ms <= (k + 1) * step_ms - 1 <= start_ms + length_ms]
    assert evals == want
    assert all(promapi.window_points(w, step) <= max_points for w in windows)
    if by_day:  # no window holds buckets starting on two UTC days
        for w in windows:
            lo, hi = promapi.window_span(w, step)
            assert lo // DAY == (hi - step) // DAY


def test_split_halves_a_window_on_its_grid() -> None:
    assert promapi.split_window((0.999, 9.999), 1) == ((0.999, 4.999), (5.999, 9.999))
    assert promapi.split_window((14.999, 59.999), 15) == ((14.999, 29.999), (44.999, 59.999))
    assert promapi.split_window((14.999, 44.999), 15) == ((14.999, 14.999), (29.999, 44.999))
    with pytest.raises(ValueError, match="one evaluation"):
        promapi.split_window((14.999, 14.999), 15)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"start": 5, "end": 4, "step_s": 1}, "bad range"),
    ({"start": 0, "end": 4, "step_s": 0}, "bad range"),
    ({"start": 0, "end": 4, "step_s": 0.0005}, "whole number of milliseconds"),
    ({"start": 0, "end": 4, "step_s": 1, "max_points": 11_001}, "between 1 and 11000"),
    ({"start": 0, "end": 4, "step_s": 1, "max_points": 0}, "between 1 and 11000"),
])
def test_impossible_plans_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        promapi.range_windows(**kwargs)


# -------------------------------------------------------------------------- time


@pytest.mark.parametrize(("text", "want"), [
    ("now", NOW),
    ("NOW", NOW),
    ("-30d", NOW - 30 * DAY),
    ("-6h", NOW - 6 * 3600),
    ("-90s", NOW - 90),
    ("-500ms", NOW - 0.5),
    ("-1w", NOW - 7 * DAY),
    ("-1d12h", NOW - 1.5 * DAY),
    ("-1.5h", NOW - 5400),
    ("now-6h", NOW - 6 * 3600),
    ("2026-11-01", dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp()),
    ("2026-11-01T12:00:00Z", dt.datetime(2026, 11, 1, 12, tzinfo=dt.UTC).timestamp()),
    ("2026-11-01T12:00:00", dt.datetime(2026, 11, 1, 12, tzinfo=dt.UTC).timestamp()),  # no zone: UTC
    ("2026-11-01T14:00+02:00", dt.datetime(2026, 11, 1, 12, tzinfo=dt.UTC).timestamp()),
    ("2026-11-01 12:00:00.250Z", dt.datetime(2026, 11, 1, 12, tzinfo=dt.UTC).timestamp() + 0.25),
])
def test_times(text: str, want: float) -> None:
    assert promapi.parse_time(text, now=NOW) == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("text", ["", "yesterday", "30d", "-30", "-30x", "+6h", "-6h-", "2026-13-01", "now+1h",
                                  "1795211698"])
def test_unparseable_times_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a time: use ISO-8601 .* -30d"):
        promapi.parse_time(text, now=NOW)


def test_a_range_is_checked_as_a_whole() -> None:
    assert promapi.parse_range("-1h", "now", now=NOW) == (NOW - 3600, NOW)
    with pytest.raises(ValueError, match=r"^--end 2026-11-20T11:00:00Z \(-1h\) is before --start "
                                         r"2026-11-20T12:00:00Z \(now\)$"):
        promapi.parse_range("now", "-1h", now=NOW)
    with pytest.raises(ValueError, match=r"^--start: 'soon' is not a time"):
        promapi.parse_range("soon", "now", now=NOW)
    with pytest.raises(ValueError, match=r"^--end: 'later' is not a time"):
        promapi.parse_range("-1h", "later", now=NOW)


# ------------------------------------------------------------ queries and answers


def test_the_query_asks_for_the_contract_and_grouped_up_only() -> None:
    assert promapi.sla_query() == (
        '{__name__=~"understudy_group_mode|understudy_broker_permission|understudy_group_epoch|'
        'understudy_failover_total|understudy_group_mode_entered_timestamp_seconds|'
        'understudy_broker_exited_timestamp_seconds|understudy_broker_started_timestamp_seconds|'
        'understudy_broker_read_gained_timestamp_seconds|understudy_broker_read_lost_timestamp_seconds|'
        'understudy_topic_queue_info|understudy_consumer_lag_messages"} '
        'or up{group!=""}')
    assert promapi.sla_query('{namespace="prod", cluster=~"eu-.*"}').endswith(
        'understudy_consumer_lag_messages",namespace="prod", cluster=~"eu-.*"} or '
        'up{group!="",namespace="prod", cluster=~"eu-.*"}')
    assert promapi.selector(["a", "b"]) == '{__name__=~"a|b"}'


@pytest.mark.parametrize("matchers", ["namespace", 'namespace=prod', 'a="b"} or vector(1) or {c="d"', '1a="b"'])
def test_bad_label_matchers_are_refused(matchers: str) -> None:
    with pytest.raises(ValueError, match="not a list of label matchers"):
        promapi.sla_query(matchers)


def test_headers() -> None:
    assert promapi.parse_header("X-Scope-OrgID:  team-a ") == ("X-Scope-OrgID", "team-a")
    assert promapi.parse_header("Authorization: Basic a:b") == ("Authorization", "Basic a:b")
    for bad in ("no colon", "Bad Name: x", ": x"):
        with pytest.raises(ValueError, match="is not a header"):
            promapi.parse_header(bad)


@pytest.mark.parametrize(("body", "message"), [
    (b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}', "parse error at char 3"),
    (b"<html>proxy error</html>", "not JSON"),
    (b'{"status":"success","data":{"resultType":"matrix","result":[', "not JSON"),
    (b'["success"]', "unexpected answer"),
    (b'{"status":"success","data":{"resultType":"vector","result":[]}}', "expected a matrix, got 'vector'"),
])
def test_unusable_answers_name_the_problem(body: bytes, message: str) -> None:
    with pytest.raises(promapi.PrometheusError, match=message):
        promapi.check_matrix(body, what="query_range")


def test_error_bodies_are_summed_up() -> None:
    assert promapi.error_detail(b'{"status":"error","errorType":"bad_data","error":"x"}') == "bad_data: x"
    assert promapi.error_detail(b"<html>\n  502 Bad   Gateway\n</html>") == "<html> 502 Bad Gateway </html>"
    assert promapi.error_detail(b"") == "(empty body)"


# ----------------------------------------------------------- a fake Prometheus


Answer = tuple[int, dict[str, str], bytes]


def matrix(params: dict[str, str], *, series: int = 2) -> bytes:
    """What Prometheus answers to query_range: one evaluation per step from start to end."""
    start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
    times = [round(start + i * step, 3) for i in range(round((end - start) / step) + 1)]
    result = [{"metric": {"__name__": "understudy_group_mode", "group": f"g{n}"},
               "values": [[t, str(n)] for t in times]} for n in range(series)]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


def ok(params: dict[str, str]) -> Answer:
    return 200, {"Content-Type": "application/json"}, matrix(params)


def error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Callable[..., Answer]:
    body = json.dumps({"status": "error", "errorType": kind, "error": message}).encode()
    return lambda _params: (status, {"Content-Type": "application/json", **(headers or {})}, body)


@dataclass
class FakePrometheus:
    """Answers requests with ``script`` in turn (the last one repeats); records them."""

    url: str
    script: list[Callable[[dict[str, str]], Answer]] = field(default_factory=lambda: [ok])
    requests: list[tuple[str, dict[str, str], dict[str, str]]] = field(default_factory=list)
    delay_s: float = 0.0

    def answer(self, path: str, params: dict[str, str], headers: dict[str, str]) -> Answer:
        self.requests.append((path, params, headers))
        if self.delay_s:
            time.sleep(self.delay_s)
        step = self.script[min(len(self.requests), len(self.script)) - 1]
        return step(params)


class _QuietServer(http.server.ThreadingHTTPServer):
    """A request's error (a client that went away, a stray connection left by an earlier
    test to a port this server now has) is kept, not printed: printed from the server's
    thread, it landed in the output of whatever CLI command a test was running then
    (seen once: a usage-error test found a traceback that was not the CLI's)."""

    errors: list[str]

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.__dict__.setdefault("errors", []).append(traceback.format_exc())


def _serve(fake_holder: list[FakePrometheus], *, tls: ssl.SSLContext | None = None) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            params = dict(urllib.parse.parse_qsl(parts.query))
            headers_in = {k.lower(): v for k, v in self.headers.items()}  # names are case-insensitive
            status, headers, body = fake_holder[0].answer(parts.path, params, headers_in)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = _QuietServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    return server


@contextlib.contextmanager
def running(*, tls: ssl.SSLContext | None = None) -> Iterator[FakePrometheus]:
    """A :class:`FakePrometheus` on 127.0.0.1, stopped (and its port closed) afterwards."""
    holder: list[FakePrometheus] = []
    server = _serve(holder, tls=tls)
    holder.append(FakePrometheus(f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    with running() as server:
        yield server


def _client(url: str, **kwargs: Any) -> tuple[promapi.PrometheusClient, list[float]]:
    sleeps: list[float] = []
    kwargs.setdefault("retries", 2)
    return promapi.PrometheusClient(url, sleep=sleeps.append, timeout_s=kwargs.pop("timeout_s", 5.0), **kwargs), sleeps


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


WINDOW = (NOW + 14.999, NOW + 59.999)
RANGE = {"query": "up", "start": "1", "end": "2", "step": "1"}


# ------------------------------------------------------------------------ client


def test_an_answer_is_checked_and_kept(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    client, sleeps = _client(fake.url + "/prom/")  # a route prefix, trailing slash
    got = client.query_range_to(tmp_path / "a.json", query="up", window=WINDOW, step_s=15)
    assert (got.series, got.points) == (2, 8)
    assert json.loads((tmp_path / "a.json").read_text())["data"]["resultType"] == "matrix"
    assert not list(tmp_path.glob("*.part"))
    ((path, params, _headers),) = fake.requests
    assert path == "/prom/api/v1/query_range"
    assert params == {"query": "up", "start": f"{NOW + 14.999:.3f}", "end": f"{NOW + 59.999:.3f}", "step": "15"}
    assert sleeps == []


def test_an_unreachable_url_is_retried_then_named(tmp_path: pathlib.Path) -> None:
    client, sleeps = _client(f"http://127.0.0.1:{_closed_port()}", retries=2)
    with pytest.raises(promapi.PrometheusError, match=r"cannot reach http://127\.0\.0\.1:\d+: .*refused.*"
                                                      r"gave up after 3 attempts"):
        client.query_range_to(tmp_path / "a.json", query="up", window=WINDOW, step_s=15)
    assert len(sleeps) == 2
    assert 0.4 <= sleeps[0] <= 0.6  # 0.5 s, doubling, with jitter
    assert 0.8 <= sleeps[1] <= 1.2
    assert not list(tmp_path.iterdir())


def test_a_4xx_fails_at_once_with_prometheus_message(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    fake.script = [error(400, "bad_data", '1:5: parse error: unexpected "}"')]
    client, sleeps = _client(fake.url)
    with pytest.raises(promapi.PrometheusError,
                       match=r'HTTP 400 from http://127.0.0.1:\d+: bad_data: 1:5: parse error: unexpected "}"') as caught:
        client.query_range_to(tmp_path / "a.json", query="up{", window=WINDOW, step_s=15)
    assert (caught.value.status, caught.value.too_big) == (400, False)
    assert len(fake.requests) == 1
    assert sleeps == []


def test_5xx_and_429_are_retried_with_backoff_and_retry_after(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    fake.script = [error(503, "unavailable", "too many queries"),
                   error(429, "unavailable", "slow down", {"Retry-After": "7"}), ok]
    client, sleeps = _client(fake.url, retries=3)
    got = client.query_range_to(tmp_path / "a.json", query="up", window=WINDOW, step_s=15)
    assert got.points == 8
    assert len(fake.requests) == 3
    assert sleeps[1] == 7.0  # the server's Retry-After beats the 1 s backoff


def test_retries_are_bounded(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    fake.script = [error(500, "internal", "boom")]
    client, _ = _client(fake.url, retries=1)
    with pytest.raises(promapi.PrometheusError, match=r"HTTP 500: internal: boom \(gave up after 2 attempts"):
        client.query_range_to(tmp_path / "a.json", query="up", window=WINDOW, step_s=15)
    assert len(fake.requests) == 2


def test_a_slow_server_times_out_and_is_retried(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    fake.delay_s = 1.0
    client, sleeps = _client(fake.url, retries=1, timeout_s=0.2)
    with pytest.raises(promapi.PrometheusError, match=r"(no answer from|cannot reach) .*timed out.*gave up after 2"):
        client.query_range_to(tmp_path / "a.json", query="up", window=WINDOW, step_s=15)
    assert len(sleeps) == 1


@pytest.mark.parametrize(("body", "message"), [
    (b"<html><body>Sign in</body></html>", "not JSON"),
    (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{}', "not JSON"),
    (b'{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}', "expected a matrix"),
])
def test_malformed_answers_fail_at_once(fake: FakePrometheus, tmp_path: pathlib.Path, body: bytes,
                                        message: str) -> None:
    fake.script = [lambda _p: (200, {"Content-Type": "application/json"}, body)]
    client, _ = _client(fake.url)
    with pytest.raises(promapi.PrometheusError, match=message):
        client.query_range_to(tmp_path / "a.json", query="up", window=WINDOW, step_s=15)
    assert len(fake.requests) == 1
    assert not list(tmp_path.iterdir())


def test_large_answers_get_a_structural_check(fake: FakePrometheus, tmp_path: pathlib.Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(promapi, "FULL_CHECK_BYTES", 64)
    client, _ = _client(fake.url)
    got = client.query_range_to(tmp_path / "a.json", query="up", window=WINDOW, step_s=15)
    assert (got.series, got.points) == (None, None)
    assert got.size == (tmp_path / "a.json").stat().st_size
    fake.script = [lambda p: (200, {}, matrix(p)[:-20])]
    with pytest.raises(promapi.PrometheusError, match="ends early"):
        client.query_range_to(tmp_path / "b.json", query="up", window=WINDOW, step_s=15)


def test_gzip_answers_are_decoded(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    fake.script = [lambda p: (200, {"Content-Encoding": "gzip"}, gzip.compress(matrix(p)))]
    client, _ = _client(fake.url)
    got = client.query_range_to(tmp_path / "a.json", query="up", window=WINDOW, step_s=15)
    assert got.points == 8
    assert fake.requests[0][2]["accept-encoding"] == "gzip"


def test_authentication_headers_are_sent(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    host = fake.url.removeprefix("http://")
    client, _ = _client(fake.url, headers=[("X-Scope-OrgID", "team-a")], bearer_token_file=token)
    client.get("/api/v1/query_range", RANGE, what="q")
    token.write_text("rotated")
    client.get("/api/v1/query_range", RANGE, what="q")
    assert [r[2]["authorization"] for r in fake.requests] == ["Bearer first", "Bearer rotated"]
    assert fake.requests[0][2]["x-scope-orgid"] == "team-a"
    basic, _ = _client(f"http://alice:s%3Acret@{host}")
    basic.get("/api/v1/query_range", RANGE, what="q")
    assert fake.requests[-1][2]["authorization"] == "Basic YWxpY2U6czpjcmV0"  # alice:s:cret
    assert "alice" not in basic.base
    with pytest.raises(ValueError, match="exclude each other"):
        _client(fake.url, headers=[("authorization", "x")], bearer_token_file=token)
    token.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        _client(fake.url, bearer_token_file=token)


def test_credentials_do_not_follow_a_redirect_to_another_host(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret")
    with running() as other:
        fake.script = [lambda p: (302, {"Location": f"/moved?{urllib.parse.urlencode(p)}"}, b""),
                       lambda p: (302, {"Location": f"{other.url}/api/v1/query_range?{urllib.parse.urlencode(p)}"}, b"")]
        client, _ = _client(fake.url, bearer_token_file=token)
        assert b'"matrix"' in client.get("/api/v1/query_range", RANGE, what="q")
    assert [r[0] for r in fake.requests] == ["/api/v1/query_range", "/moved"]
    assert fake.requests[1][2]["authorization"] == "Bearer secret"  # same host: kept
    assert "authorization" not in other.requests[0][2]


@pytest.mark.parametrize("url", ["127.0.0.1:9090", "ftp://x", "http://", "http://x:99999", "http://x/?q=1"])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"URL|port|query"):
        promapi.PrometheusClient(url)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a test certificate")
def test_tls_needs_the_ca_or_an_explicit_skip(tmp_path: pathlib.Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with running(tls=tls) as server:
        untrusting, sleeps = _client(server.url)
        with pytest.raises(promapi.PrometheusError, match=r"TLS with .* certificate verify failed.*--ca-file"):
            untrusting.get("/api/v1/query_range", RANGE, what="q")
        assert sleeps == []  # not retried
        trusting, _ = _client(server.url, ca_file=cert)
        assert b'"matrix"' in trusting.get("/api/v1/query_range", RANGE, what="q")
        skipping, _ = _client(server.url, insecure_skip_verify=True)
        assert b'"matrix"' in skipping.get("/api/v1/query_range", RANGE, what="q")
    with pytest.raises(ValueError, match="--ca-file"):
        promapi.PrometheusClient(server.url, ca_file=key)


# ------------------------------------------------------------------------ export


def test_export_pages_by_day_and_every_evaluation_is_kept_once(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    start = dt.datetime(2026, 11, 1, 23, 0, tzinfo=dt.UTC).timestamp()
    client, _ = _client(fake.url)
    (tmp_path / "query_range-0009.json").write_text("an earlier export's file")
    lines: list[str] = []
    result = promapi.export_range(client, tmp_path, start=start, end=start + 2 * 3600, step_s=60,
                                  query=promapi.sla_query(), progress=lines.append)
    assert [p.name for p in result.files] == ["query_range-0000.json", "query_range-0001.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["query_range-0000.json", "query_range-0001.json"]
    times = [t for p in result.files for t, _v in json.loads(p.read_text())["data"]["result"][0]["values"]]
    assert times == [round(start + 60 * k - 0.001, 3) for k in range(1, 121)]
    assert (result.series, result.points, result.splits) == (2, 240, 0)
    assert lines[0].startswith("window 1/2 done: 2026-11-01T23:00:00Z .. 2026-11-02T00:00:00Z (60 steps)")
    assert fake.requests[0][1]["query"] == promapi.sla_query()


def test_a_window_over_the_server_limit_is_split(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    """A server with a lower limit than Prometheus' 11,000 (a proxy, or --query.max-samples):
    the window it refuses is asked again in halves until it is accepted."""
    limit = 40

    def limited(params: dict[str, str]) -> Answer:
        points = round((float(params["end"]) - float(params["start"])) / float(params["step"])) + 1
        if points > limit:
            return error(400, "bad_data", "exceeded maximum resolution of 11,000 points per timeseries. "
                                          "Try decreasing the query resolution (?step=XX)")(params)
        return ok(params)

    fake.script = [limited]
    client, sleeps = _client(fake.url)
    lines: list[str] = []
    result = promapi.export_range(client, tmp_path, start=NOW, end=NOW + 150 * 15, step_s=15, query="up",
                                  max_points=100, progress=lines.append)
    assert result.splits == 4  # 100 -> 50 + 50 -> 4 x 25; 50 -> 25 + 25
    assert len(result.files) == 6
    times = [t for p in result.files for t, _v in json.loads(p.read_text())["data"]["result"][0]["values"]]
    assert times == [round(NOW + 15 * k - 0.001, 3) for k in range(1, 151)]
    assert sum("too large for the server" in line for line in lines) == 4
    assert sleeps == []


def test_a_single_step_still_too_large_is_an_error(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    fake.script = [error(422, "execution", "query processing would load too many samples into memory")]
    client, _ = _client(fake.url)
    with pytest.raises(promapi.PrometheusError, match="too many samples"):
        promapi.export_range(client, tmp_path, start=NOW, end=NOW + 15, step_s=15, query="up")
    assert len(fake.requests) == 1


# ----------------------------------------------------------------------- commands


def test_sla_export_writes_query_range_files(fake: FakePrometheus, tmp_path: pathlib.Path) -> None:
    # absolute times: a relative hour crosses UTC midnight, where windows are split, 1 run in 24
    result = CliRunner().invoke(sla, ["export", "--prometheus", fake.url, "--start", "2026-11-02T10:00:00Z",
                                      "--end", "2026-11-02T11:00:00Z", "--step", "1m", "--header",
                                      "X-Scope-OrgID: team-a", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "wrote 1 file(s)" in result.stdout
    assert f"understudy sla report --input {tmp_path} --step 60s" in result.stdout
    assert "window 1/1 done" in result.stderr
    (params, headers) = fake.requests[0][1:]
    assert round((float(params["end"]) - float(params["start"])) / 60) == 59  # 60 whole minutes
    assert headers["x-scope-orgid"] == "team-a"
    assert json.loads((tmp_path / "query_range-0000.json").read_text())["status"] == "success"


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--start", "-1h", "--end", "-2h"], 2, "is before --start"),
    (["--start", "yesterday"], 2, "--start: 'yesterday' is not a time"),
    (["--start", "-1h", "--end", "2026-02-30"], 2, "--end: '2026-02-30' is not a time"),
    # absolute times: no evaluation time (1 ms before a minute ends) falls inside; a
    # relative 9 s window held one in 15 % of runs, whenever a minute ended inside it
    (["--start", "2026-01-01T00:00:10Z", "--end", "2026-01-01T00:00:50Z", "--step", "1m"], 2,
     "nothing to read"),
    (["--start", "-1h", "--header", "no-colon"], 2, "is not a header"),
    (["--start", "-1h", "--labels", "namespace"], 2, "not a list of label matchers"),
    (["--start", "-1h", "--max-points", "20000"], 2, "--max-points"),
])
def test_sla_export_usage_errors(fake: FakePrometheus, tmp_path: pathlib.Path, args: list[str], code: int,
                                 message: str) -> None:
    result = CliRunner().invoke(sla, ["export", "--prometheus", fake.url, "--out", str(tmp_path), *args])
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert fake.requests == []


@pytest.mark.parametrize(("answer", "message"), [
    (error(400, "bad_data", "invalid parameter \"query\": 1:1: parse error"),
     'HTTP 400 from http://127.0.0.1:PORT: bad_data: invalid parameter "query": 1:1: parse error'),
    (lambda _p: (200, {"Content-Type": "text/html"}, b"<html>login</html>"), "not JSON"),
])
def test_sla_export_server_errors(fake: FakePrometheus, tmp_path: pathlib.Path, answer: Callable[..., Answer],
                                  message: str) -> None:
    fake.script = [answer]
    result = CliRunner().invoke(sla, ["export", "--prometheus", fake.url, "--start", "-1h", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert message.replace("PORT", fake.url.rsplit(":", 1)[1]) in result.stderr
    assert "Traceback" not in result.output
    assert not list(tmp_path.glob("*.json"))


def test_sla_export_to_an_unreachable_url(tmp_path: pathlib.Path) -> None:
    port = _closed_port()
    result = CliRunner().invoke(sla, ["export", "--prometheus", f"http://127.0.0.1:{port}", "--start", "-1h",
                                      "--retries", "0", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert f"cannot reach http://127.0.0.1:{port}" in result.stderr
    assert "gave up after 1 attempt " in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    ([], "exactly one of --input PATH (export files) and --prometheus URL"),
    (["--input", "x", "--prometheus", "http://127.0.0.1:1", "--start", "-1h"], "exactly one of --input"),
    (["--input", "x", "--start", "-1h", "--insecure-skip-verify"],
     "--start, --insecure-skip-verify only go(es) with --prometheus URL"),
    (["--prometheus", "http://127.0.0.1:1"], "--prometheus URL needs --start T"),
])
def test_sla_report_needs_one_source(tmp_path: pathlib.Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(sla, ["report", "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "out").exists()


def test_sla_report_fails_on_an_unreachable_url_before_spark_starts(tmp_path: pathlib.Path) -> None:
    result = CliRunner().invoke(sla, ["report", "--prometheus", f"http://127.0.0.1:{_closed_port()}",
                                      "--start", "-1h", "--retries", "0", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert "cannot reach" in result.stderr
    assert "starting Spark" not in result.stderr
