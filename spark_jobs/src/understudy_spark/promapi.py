"""Read the SLA series straight from a Prometheus HTTP API (``/api/v1/query_range``).

Why this module exists: without it a user has to export Prometheus data to files by hand
before ``understudy sla report --input`` can read it. ``sla report --prometheus URL`` and
``sla export --prometheus URL`` ask Prometheus themselves and write the same
``query_range`` JSON files the job's reader already parses (:mod:`understudy_spark.readers`).

Pure decisions (no I/O, tested without a server): :func:`parse_time` and
:func:`parse_range` (ISO-8601 or ``-30d``/``now``), :func:`range_windows` and
:func:`split_window` (the plan of requests), :func:`sla_query` and :func:`selector` (which
series), :func:`api_data`, :func:`check_matrix` and :func:`error_detail` (what an answer
says). :class:`PrometheusClient` is the thin HTTP part (urllib, retries with backoff,
authentication, TLS), and :func:`export_range` runs a plan with it into files.
``understudy_harness.promrun`` (the private Prometheus the drill and the tests record
with) uses the same planning, selector and answer checks.

Time alignment (shared with ``promrun``): the job cuts time into buckets
``floor(t / step)``. PromQL takes the latest sample at or before an evaluation time, so
evaluating at bucket *starts* would show a sample scraped inside bucket ``k`` only at
``k + 1``, one step later than the raw samples in a ``promtool tsdb dump``. Evaluation
times are therefore placed 1 ms before each bucket's end: every form puts a scrape into
the same bucket. Only whole buckets inside ``[start, end]`` are asked for.

Paging: Prometheus refuses a ``query_range`` answer with more than 11,000 points per
series. Windows hold at most :data:`MAX_POINTS` evaluations and never cross a UTC midnight
(one file per day at most, as synthetic exports are laid out), and a window Prometheus
still refuses as too large (its resolution limit, or ``--query.max-samples``) is split in
two and asked again.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import http.client
import json
import math
import random
import re
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from understudy_broker import metric_names as names

#: The series an SLA export carries: the metrics contract the job reads (DESIGN.md), the
#: event times it places transitions with (docs/sla.md "Event times"), the topic placement
#: and consumer lag of the topic SLA (docs/sla.md "Topic SLA"), and ``up``. The job ignores
#: ``understudy_group_epoch``; it is exported so that the files are a faithful copy of the
#: contract, as ``promrun``'s exports are.
SLA_METRICS: tuple[str, ...] = (
    names.GROUP_MODE,
    names.BROKER_PERMISSION,
    names.GROUP_EPOCH,
    names.FAILOVER_TOTAL,
    names.GROUP_MODE_ENTERED,
    names.BROKER_EXITED,
    names.BROKER_STARTED,
    names.BROKER_READ_GAINED,
    names.BROKER_READ_LOST,
    names.TOPIC_QUEUE_INFO,
    names.CONSUMER_LAG_MESSAGES,
    names.UP,
)
#: Prometheus refuses query_range answers above this many points per series.
POINT_LIMIT = 11_000
#: Evaluations per series and request by default: below the limit, with room to spare.
MAX_POINTS = 10_000
#: Evaluation times sit this far before each bucket's end (see the module docstring).
EVAL_BEFORE_BUCKET_END_S = 0.001
#: Windows never cross a multiple of this (UTC midnight): one file per day at most.
DAY_S = 86_400.0
#: Answers up to this size are parsed whole before they are kept (exact series and point
#: counts, any JSON error caught here); larger ones get a structural check (head, status,
#: result type, complete end) and the job's reader parses them in full.
FULL_CHECK_BYTES = 64 * 1024 * 1024

class _Body(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


Window = tuple[float, float]
"""``(first, last)``: the first and last evaluation time (Unix seconds) of one request."""
Progress = Callable[[str], None]


class PrometheusError(RuntimeError):
    """Prometheus is missing, unreachable or did not start, refused a request, or answered
    something unusable; the message says which. ``status`` is the HTTP status when the
    server answered with an error, ``too_big`` whether the request asked for more points
    or samples than the server allows (a smaller window may work)."""

    def __init__(self, message: str, *, status: int | None = None, too_big: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.too_big = too_big


# ----------------------------------------------------------------------------- time

_RELATIVE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")
_RELATIVE_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
TIME_HELP = (
    "ISO-8601 (2026-11-01, 2026-11-01T12:00:00Z, 2026-11-01T14:00+02:00; no zone = UTC), "
    "or relative to now: now, -30d, -6h, -1d12h, -90s (units ms s m h d w)"
)


def parse_time(text: str, *, now: float) -> float:
    """Unix seconds for ``text``: ISO-8601 (a zone-less time is UTC), ``now``, or a time
    relative to ``now`` (``-30d``, ``-6h``, ``-1d12h``, also written ``now-6h``). Pure."""
    raw = text.strip()
    low = raw.lower()
    if low == "now":
        return now
    if low.startswith("now-"):
        low = low[3:]
    if low.startswith("-") and _RELATIVE.fullmatch(low[1:]):
        back = sum(float(n) * _UNIT_S[unit] for n, unit in _RELATIVE_PART.findall(low[1:]))
        return now - back
    try:
        parsed = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use {TIME_HELP}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def parse_range(start: str, end: str, *, now: float) -> tuple[float, float]:
    """``(start, end)`` in Unix seconds from the two option texts, both relative to the
    same ``now``. Raises ``ValueError`` naming the option for an unparseable time or an
    end before the start. Pure."""
    try:
        t0 = parse_time(start, now=now)
    except ValueError as exc:
        raise ValueError(f"--start: {exc}") from None
    try:
        t1 = parse_time(end, now=now)
    except ValueError as exc:
        raise ValueError(f"--end: {exc}") from None
    if t1 < t0:
        raise ValueError(f"--end {iso(t1)} ({end}) is before --start {iso(t0)} ({start})")
    return t0, t1


def iso(t: float) -> str:
    """``2026-11-01T12:00:00Z`` (milliseconds shown only when there are any)."""
    stamp = dt.datetime.fromtimestamp(round(t, 3), tz=dt.UTC)
    text = stamp.strftime("%Y-%m-%dT%H:%M:%S")
    if stamp.microsecond:
        text += f".{stamp.microsecond // 1000:03d}"
    return text + "Z"


# ------------------------------------------------------------------------- planning


def _whole_ms(seconds: float, *, what: str) -> int:
    ms = round(seconds * 1000)
    if ms <= 0 or abs(ms - seconds * 1000) > 1e-6:
        raise ValueError(f"{what} must be a positive whole number of milliseconds, got {seconds!r}")
    return ms


def _eval_s(bucket: int, step_ms: int) -> float:
    """The evaluation time of ``bucket``: 1 ms before its end."""
    return ((bucket + 1) * step_ms - round(EVAL_BEFORE_BUCKET_END_S * 1000)) / 1000


def _bucket_of_eval(t: float, step_ms: int) -> int:
    return (round(t * 1000) + round(EVAL_BEFORE_BUCKET_END_S * 1000)) // step_ms - 1


def range_windows(
    *, start: float, end: float, step_s: float, max_points: int = MAX_POINTS, split_every_s: float | None = None,
) -> list[Window]:
    """Evaluation windows ``(first, last)`` covering ``[start, end]`` in ``step_s`` steps,
    at most ``max_points`` evaluations each, and, with ``split_every_s``, none holding
    buckets that start on both sides of a multiple of it (``DAY_S``: UTC midnight).
    Evaluation times are 1 ms before the end of each bucket ``[k*step, (k+1)*step)``
    (see the module docstring); a bucket is included when that time is inside
    ``[start, end]``. Works in whole milliseconds. Pure."""
    if step_s <= 0 or end < start:
        raise ValueError(f"bad range: start={start} end={end} step={step_s}")
    if not 1 <= max_points <= POINT_LIMIT:
        raise ValueError(f"max_points must be between 1 and {POINT_LIMIT}, got {max_points}")
    step = _whole_ms(step_s, what="the step")
    split = None if split_every_s is None else _whole_ms(split_every_s, what="the split interval")
    before = round(EVAL_BEFORE_BUCKET_END_S * 1000)
    lo, hi = math.ceil(round(start * 1000, 3)), math.floor(round(end * 1000, 3))
    first = -(-(lo + before) // step) - 1  # the first k with (k + 1) * step - 1 ms >= start
    last = (hi + before) // step - 1  # the last k with (k + 1) * step - 1 ms <= end
    windows: list[Window] = []
    k = first
    while k <= last:
        top = min(last, k + max_points - 1)
        if split is not None:
            boundary = (k * step // split + 1) * split
            top = min(top, -(-boundary // step) - 1)  # the last bucket starting before it
        windows.append((_eval_s(k, step), _eval_s(top, step)))
        k = top + 1
    return windows


def window_points(window: Window, step_s: float) -> int:
    """How many evaluations ``window`` holds. Pure."""
    step = _whole_ms(step_s, what="the step")
    return _bucket_of_eval(window[1], step) - _bucket_of_eval(window[0], step) + 1


def split_window(window: Window, step_s: float) -> tuple[Window, Window]:
    """``window`` cut into two halves on the same evaluation grid (at least two points).
    Pure."""
    step = _whole_ms(step_s, what="the step")
    k0, k1 = _bucket_of_eval(window[0], step), _bucket_of_eval(window[1], step)
    if k1 <= k0:
        raise ValueError(f"a window of one evaluation cannot be split: {window}")
    mid = k0 + (k1 - k0 + 1) // 2 - 1
    return (_eval_s(k0, step), _eval_s(mid, step)), (_eval_s(mid + 1, step), _eval_s(k1, step))


def window_span(window: Window, step_s: float) -> tuple[float, float]:
    """The buckets ``window`` covers: the first one's start and the last one's end. Pure."""
    return window[0] + EVAL_BEFORE_BUCKET_END_S - step_s, window[1] + EVAL_BEFORE_BUCKET_END_S


# -------------------------------------------------------------------------- queries

_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_MATCHERS = re.compile(rf"(?:{_MATCHER}(?:,{_MATCHER})*,?\s*)?")


def selector(metrics: Sequence[str] = SLA_METRICS) -> str:
    """A series selector for ``metrics`` (``{__name__=~"a|b"}``); also what
    ``promtool tsdb dump --match`` takes. Pure."""
    return '{__name__=~"' + "|".join(metrics) + '"}'


def check_matchers(matchers: str) -> str:
    """``matchers`` (``namespace="prod",cluster=~"eu-.*"``) stripped, or ``ValueError``. Pure."""
    text = matchers.strip().strip(",").strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if not _MATCHERS.fullmatch(text):
        raise ValueError(
            f"{matchers!r} is not a list of label matchers like namespace=\"prod\",cluster=~\"eu-.*\""
        )
    return text


def sla_query(matchers: str = "") -> str:
    """The PromQL of an SLA export: the contract's metrics, and ``up`` only where it
    carries a ``group`` label (the job uses no other ``up``, and a shared Prometheus may
    hold ``up`` of thousands of unrelated targets). ``matchers`` are added to both
    selectors. Pure."""
    extra = check_matchers(matchers)
    contract = [m for m in SLA_METRICS if m != names.UP]
    tail = f",{extra}" if extra else ""
    return '{__name__=~"' + "|".join(contract) + '"' + tail + "} or " + names.UP + '{group!=""' + tail + "}"


# -------------------------------------------------------------------------- answers

_TOO_BIG = re.compile(r"maximum resolution|points per timeseries|too many samples", re.IGNORECASE)


def error_detail(body: bytes) -> str:
    """What an error answer says: Prometheus' ``errorType: error`` from its JSON, or the
    start of any other body (a proxy's page). Pure."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict) and doc.get("error"):
        kind = doc.get("errorType")
        return f"{kind}: {doc['error']}" if kind else str(doc["error"])
    text = body[:300].decode("utf-8", "replace").strip()
    return " ".join(text.split()) or "(empty body)"


def _answer(body: bytes, *, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PrometheusError(f"{what}: not JSON ({exc}): {error_detail(body)[:120]}") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc.get("error") if isinstance(doc, dict) else None
        raise PrometheusError(f"{what}: {err or 'unexpected answer'}")
    return doc


def api_data(body: bytes, *, what: str) -> Any:
    """The ``data`` of a Prometheus API answer; :class:`PrometheusError` otherwise. Pure."""
    return _answer(body, what=what).get("data")


def check_matrix(body: bytes, *, what: str) -> dict[str, Any]:
    """The whole of a successful ``query_range`` answer whose ``data`` is a matrix. Pure."""
    doc = _answer(body, what=what)
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise PrometheusError(f"{what}: expected a matrix, got {kind!r}")
    return doc


_HEAD = re.compile(rb'^\s*\{\s*"status"\s*:\s*"success"\s*,\s*"data"\s*:\s*\{\s*"resultType"\s*:\s*"matrix"')


def check_large_matrix(head: bytes, tail: bytes, *, what: str) -> None:
    """The structural check of an answer too large to parse here: it opens as a
    successful matrix and ends with ``}``. Pure."""
    if not _HEAD.match(head):
        raise PrometheusError(f"{what}: not a successful query_range matrix: {error_detail(head)[:120]}")
    if not tail.rstrip().endswith(b"}"):
        raise PrometheusError(f"{what}: the answer ends early (truncated JSON)")


# --------------------------------------------------------------------------- client


def parse_header(text: str) -> tuple[str, str]:
    """``'Name: value'`` -> ``("Name", "value")``. Pure."""
    name, sep, value = text.partition(":")
    name = name.strip()
    if not sep or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
        raise ValueError(f"{text!r} is not a header like 'X-Scope-OrgID: team-a'")
    return name, value.strip()


class _Retry(Exception):
    """An attempt failed in a way a later attempt may not: ``delay_s`` is what the server
    asked for (``Retry-After``)."""

    def __init__(self, reason: str, delay_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s


class _SameHostAuthRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but sends ``Authorization`` to the host it was meant for only."""

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Any, newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


@dataclass(frozen=True, slots=True)
class Fetched:
    """One answer kept in a file: its size, and the series and points in it (``None``
    when it was too large to count here)."""

    path: Path
    size: int
    series: int | None
    points: int | None
    warnings: tuple[str, ...] = ()


class PrometheusClient:
    """A Prometheus HTTP API at ``url`` (``http(s)://host:port[/prefix]``; credentials
    in the URL become basic authentication).

    Every request is retried on connection errors, timeouts, HTTP 429 and 5xx, at most
    ``retries`` times, after ``backoff_s`` doubling up to ``max_backoff_s`` (with jitter,
    or what ``Retry-After`` asks for, up to a minute). Any other 4xx fails at once with
    the server's own message. ``headers`` are sent with every request; the bearer token
    is read from ``bearer_token_file`` on every request (rotated tokens keep working).
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        bearer_token_file: Path | None = None,
        ca_file: Path | None = None,
        insecure_skip_verify: bool = False,
        timeout_s: float = 60.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
        log: Progress | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL of a Prometheus server")
        if parts.query or parts.fragment:
            raise ValueError(f"{url!r}: give the server's base URL, without a query or fragment")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{url!r}: bad port") from None
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc = host + (f":{port}" if port is not None else "")
        self.base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.headers: dict[str, str] = {"Accept": "application/json", "Accept-Encoding": "gzip",
                                        "User-Agent": "understudy-sla"}
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            self.headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        for name, value in headers:
            if name.lower() == "authorization" and bearer_token_file is not None:
                raise ValueError("an Authorization header and --bearer-token-file exclude each other")
            self.headers = {k: v for k, v in self.headers.items() if k.lower() != name.lower()}
            self.headers[name] = value
        self.bearer_token_file = bearer_token_file
        if bearer_token_file is not None:
            self._bearer()  # fail now, not at the first request
        self.ssl_context: ssl.SSLContext | None = None
        if parts.scheme == "https":
            try:
                self.ssl_context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--ca-file {ca_file}: not a readable PEM certificate bundle ({exc})") from None
            if insecure_skip_verify:
                self.ssl_context.check_hostname = False
                self.ssl_context.verify_mode = ssl.CERT_NONE
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.sleep = sleep
        self.log = log or (lambda _message: None)
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=self.ssl_context), _SameHostAuthRedirects()
        )

    def _bearer(self) -> str:
        assert self.bearer_token_file is not None
        try:
            token = self.bearer_token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"--bearer-token-file {self.bearer_token_file}: {exc.strerror or exc}") from None
        if not token:
            raise ValueError(f"--bearer-token-file {self.bearer_token_file} is empty")
        return token

    # ---------------------------------------------------------------- requests

    def _request(self, path: str, params: Mapping[str, str]) -> urllib.request.Request:
        headers = dict(self.headers)
        if self.bearer_token_file is not None:
            try:
                headers["Authorization"] = f"Bearer {self._bearer()}"
            except ValueError as exc:
                raise PrometheusError(str(exc)) from None
        query = urllib.parse.urlencode(params)
        return urllib.request.Request(f"{self.base}{path}?{query}", headers=headers, method="GET")

    @contextlib.contextmanager
    def _open(self, path: str, params: Mapping[str, str], *, what: str) -> Iterator[_Body]:
        """One attempt: the answer's (decompressed) body as a stream. Raises
        :class:`_Retry` for what a retry may cure, :class:`PrometheusError` otherwise."""
        try:
            resp = self._opener.open(self._request(path, params), timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            body = _read_error_body(exc)
            exc.close()
            detail = error_detail(body)
            if exc.code == 429 or exc.code >= 500:
                raise _Retry(f"HTTP {exc.code}: {detail}", _retry_after(exc.headers.get("Retry-After"))) from None
            raise PrometheusError(f"{what}: HTTP {exc.code} from {self.base}: {detail}",
                                  status=exc.code, too_big=bool(_TOO_BIG.search(detail))) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLError):
                verify = getattr(reason, "verify_message", None)
                raise PrometheusError(
                    f"{what}: TLS with {self.base} failed: "
                    + (f"certificate verify failed: {verify}" if verify else str(reason))
                    + " (--ca-file trusts a private CA; --insecure-skip-verify skips the check)"
                ) from None
            raise _Retry(f"cannot reach {self.base}: {reason}") from None
        except (TimeoutError, ConnectionError, http.client.HTTPException) as exc:
            raise _Retry(f"no answer from {self.base}: {type(exc).__name__}: {exc}") from None
        with resp:
            gz = resp.headers.get("Content-Encoding", "").lower() == "gzip"
            yield _Gunzip(resp) if gz else resp

    def _retrying(self, what: str, attempt: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        for n in range(self.retries + 1):
            try:
                return attempt()
            except _Retry as retry:
                if n == self.retries:
                    tries = f"{n + 1} attempt{'s' if n else ''}"
                    raise PrometheusError(
                        f"{what}: {retry.reason} (gave up after {tries} in {time.monotonic() - t0:.1f} s)"
                    ) from None
                delay = min(self.max_backoff_s, self.backoff_s * 2**n) * random.uniform(0.8, 1.2)
                if retry.delay_s is not None:
                    delay = max(delay, retry.delay_s)
                self.log(f"{what}: {retry.reason}; retry {n + 1} of {self.retries} in {delay:.1f} s")
                self.sleep(delay)
        raise AssertionError("unreachable")

    def get(self, path: str, params: Mapping[str, str], *, what: str) -> bytes:
        """A small answer, whole (e.g. ``/api/v1/query``), with retries."""

        def attempt() -> bytes:
            with self._open(path, params, what=what) as body:
                return _read_all(body)

        result: bytes = self._retrying(what, attempt)
        return result

    def query_range_to(self, dest: Path, *, query: str, window: Window, step_s: float) -> Fetched:
        """One ``/api/v1/query_range`` answer for ``window`` streamed into ``dest`` (through
        ``dest.part``, renamed once checked), with retries."""
        first, last = window
        params = {"query": query, "start": f"{first:.3f}", "end": f"{last:.3f}", "step": _seconds(step_s)}
        what = f"query_range {iso(first)} .. {iso(last)}"
        part = dest.with_name(dest.name + ".part")

        def attempt() -> Fetched:
            size, head, tail = 0, b"", b""
            with self._open("/api/v1/query_range", params, what=what) as body, part.open("wb") as out:
                while True:
                    chunk = _read_chunk(body)
                    if not chunk:
                        break
                    out.write(chunk)
                    size += len(chunk)
                    if len(head) < 4096:
                        head += chunk[: 4096 - len(head)]
                    tail = (tail + chunk)[-64:]
            return self._checked(part, dest, size=size, head=head, tail=tail, what=what)

        try:
            fetched: Fetched = self._retrying(what, attempt)
        finally:
            with contextlib.suppress(OSError):
                part.unlink()
        return fetched

    def _checked(self, part: Path, dest: Path, *, size: int, head: bytes, tail: bytes, what: str) -> Fetched:
        if size > FULL_CHECK_BYTES:
            check_large_matrix(head, tail, what=what)
            part.replace(dest)
            return Fetched(dest, size, None, None)
        doc = check_matrix(part.read_bytes(), what=what)
        warnings = tuple(str(w) for w in doc.get("warnings") or ())
        series = doc["data"]["result"]
        points = sum(len(s.get("values") or ()) for s in series if isinstance(s, dict))
        part.replace(dest)
        return Fetched(dest, size, len(series), points, warnings)


class _Gunzip:
    """A gzip-encoded body read as its decompressed bytes, a chunk at a time."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def read(self, n: int = -1, /) -> bytes:
        while True:
            chunk = self.raw.read(n if n > 0 else 1 << 20)
            if not chunk:
                return self.inflate.flush()
            out = self.inflate.decompress(chunk)
            if out:
                return out


_CHUNK = 1 << 20


def _read_chunk(body: _Body) -> bytes:
    """A chunk of the answer; a broken connection or bad compression asks for a retry."""
    try:
        return body.read(_CHUNK)
    except (TimeoutError, ConnectionError, http.client.HTTPException, OSError) as exc:
        raise _Retry(f"the answer broke off: {type(exc).__name__}: {exc}") from None
    except zlib.error as exc:
        raise _Retry(f"the answer's gzip encoding is broken: {exc}") from None


def _read_all(body: _Body) -> bytes:
    chunks = []
    while chunk := _read_chunk(body):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_error_body(exc: urllib.error.HTTPError) -> bytes:
    try:
        raw = exc.read(1 << 16)
    except (OSError, http.client.HTTPException):
        return b""
    if exc.headers.get("Content-Encoding", "").lower() == "gzip":
        with contextlib.suppress(zlib.error):
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw)
    return bytes(raw)


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (only the delta form), at most a minute."""
    if value is None:
        return None
    try:
        return min(60.0, max(0.0, float(value)))
    except ValueError:
        return None


def _seconds(step_s: float) -> str:
    """A step as Prometheus reads it: seconds with up to millisecond digits."""
    return f"{step_s:.3f}".rstrip("0").rstrip(".")


# ----------------------------------------------------------------------------- export


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What :func:`export_range` wrote: ``files`` in time order."""

    files: tuple[Path, ...]
    start: float
    end: float
    step_s: float
    splits: int
    bytes: int
    series: int | None  # the most series in one answer; None if an answer was too large to count
    points: int | None


def export_range(
    client: PrometheusClient,
    out: Path,
    *,
    start: float,
    end: float,
    step_s: float,
    query: str,
    max_points: int = MAX_POINTS,
    progress: Progress | None = None,
) -> ExportResult:
    """Ask ``client`` for ``query`` over ``[start, end]`` at ``step_s`` and write one
    ``query_range-NNNN.json`` per window into ``out`` (earlier such files there are
    removed first). A window Prometheus refuses as too large is split in two."""
    say = progress or (lambda _message: None)
    pending = deque(range_windows(start=start, end=end, step_s=step_s, max_points=max_points, split_every_s=DAY_S))
    if not pending:
        raise PrometheusError(
            f"nothing to read: {iso(start)} .. {iso(end)} holds no whole step of {_seconds(step_s)} s"
        )
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("query_range-*.json"), *out.glob("query_range-*.json.part")]:
        stale.unlink()
    files: list[Path] = []
    splits = total_bytes = 0
    most_series: int | None = 0
    points: int | None = 0
    while pending:
        window = pending.popleft()
        dest = out / f"query_range-{len(files):04d}.json"
        try:
            got = client.query_range_to(dest, query=query, window=window, step_s=step_s)
        except PrometheusError as exc:
            if not exc.too_big or window_points(window, step_s) < 2:
                raise
            halves = split_window(window, step_s)
            pending.extendleft(reversed(halves))
            splits += 1
            say(f"{iso(window[0])} .. {iso(window[1])} is too large for the server "
                f"({window_points(window, step_s)} steps): asking in two halves")
            continue
        files.append(dest)
        total_bytes += got.size
        if got.series is None or most_series is None or points is None:
            most_series = points = None
        else:
            most_series = max(most_series, got.series)
            points += got.points or 0
        lo, hi = window_span(window, step_s)
        counted = f"{got.series} series, {got.points} points, " if got.series is not None else ""
        say(f"window {len(files)}/{len(files) + len(pending)} done: {iso(lo)} .. {iso(hi)} "
            f"({window_points(window, step_s)} steps): {counted}{got.size / 1e6:.1f} MB -> {dest.name}")
        for warning in got.warnings:
            say(f"Prometheus warns: {warning}")
    return ExportResult(files=tuple(files), start=start, end=end, step_s=step_s, splits=splits,
                        bytes=total_bytes, series=most_series, points=points)


def stderr_progress(tag: str) -> Progress:
    """Progress lines ``[tag   1.2s] message`` on stderr."""
    t0 = time.monotonic()
    return lambda message: print(f"[{tag} {time.monotonic() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)
