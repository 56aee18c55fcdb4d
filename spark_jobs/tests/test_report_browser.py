"""The generated report.html in a real browser: Debian's chromium, headless, driven over
the DevTools protocol on a pipe (``--remote-debugging-pipe``; standard library only).

``job.run`` writes the report of a synthetic plant (four groups, two days across a month
boundary, incidents, gaps, two readers); chromium opens it at 1000 px wide and the test
reads what the page rendered:

- no JavaScript exception, no console or browser-log error, nothing fetched but the file
  itself (a canary page first proves that this harness sees a thrown error and a fetch);
- every chart drew, and drew the data: the timeline one marker per incident, the
  distribution bars adding up to the incidents, the budget chart one bar per judged
  group-month; each chart has a size and fits the page;
- the page never scrolls sideways: a table wider than its section scrolls inside its own
  ``overflow-x: auto`` box; headers are words, not column names;
- the "where the read-unavailable time is" table adds up in the rendered DOM.

The browser test skips only when /usr/bin/chromium is missing. Chromium runs in its own session and is
killed by its process group in every case.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import fcntl
import json
import os
import pathlib
import select
import shutil
import signal
import tempfile
import time
from typing import Any

import pytest

from understudy_spark import job, report
from understudy_spark import transforms as T
from understudy_spark.synth import SynthSpec, synthesize
from understudy_spark.transforms import Targets

CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.spark
needs_chromium = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)")

WIDTH, HEIGHT = 1000, 1400
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-default-apps", "--mute-audio", f"--window-size={WIDTH},{HEIGHT}",
    "--remote-debugging-pipe",
]


class Chromium:
    """Chromium with the DevTools protocol on fds 3 (commands in) and 4 (replies out)."""

    def __init__(self, profile: pathlib.Path, log: pathlib.Path) -> None:
        # Its scratch directory (org.chromium.Chromium.*, with the singleton's socket) goes
        # into one of ours, removed in stop(): killed by SIGKILL, chromium never removes it,
        # and /tmp kept one per run. A short path: the socket's must fit in sun_path.
        self._scratch = tempfile.mkdtemp(prefix="usc-")
        to_child, self._to_browser = os.pipe()
        self._from_browser, from_child = os.pipe()
        # keep the child's ends clear of 3 and 4 while they are moved there
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_child, from_child)]
        for fd in (to_child, from_child):
            os.close(fd)
        try:
            self.pid = os.posix_spawn(
                CHROMIUM, [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                {**os.environ, "TMPDIR": self._scratch},
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
                    (os.POSIX_SPAWN_DUP2, 1, 2),
                    (os.POSIX_SPAWN_DUP2, high[0], 3),
                    (os.POSIX_SPAWN_DUP2, high[1], 4),
                ],
                setsid=True,  # its own process group: every helper process dies with it
            )
        except BaseException:
            shutil.rmtree(self._scratch, ignore_errors=True)
            raise
        finally:
            for fd in high:
                os.close(fd)
        self._next_id = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    def stop(self) -> None:
        """Kill chromium and its helpers by process group, and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._scratch, ignore_errors=True)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise ConnectionError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        parsed: dict[str, Any] = json.loads(message)
        return parsed

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_for(self, method: str, *, session: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for i, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            event = self._read_message(deadline)
            if event.get("method") == method and event.get("sessionId") == session:
                return event
            self.events.append(event)

    def open_page(self) -> str:
        """A page target with Runtime, Log, Network and Page events on; its session id."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = str(self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"])
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}, session=session)
        return session

    def load(self, session: str, url: str) -> dict[str, list[str]]:
        """Navigate, wait for the load event; the errors and requests the page caused."""
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired", session=session)
        self.send("Runtime.evaluate", {"expression": "1"}, session=session)  # flush pending events
        seen: dict[str, list[str]] = {"exceptions": [], "console": [], "log": [], "requests": []}
        for e in self.events:
            if e.get("sessionId") != session:
                continue
            p = e.get("params", {})
            if e.get("method") == "Runtime.exceptionThrown":
                details = p["exceptionDetails"]
                seen["exceptions"].append(str(details.get("exception", {}).get("description") or details.get("text")))
            elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                seen["console"].append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                seen["log"].append(str(p["entry"].get("text")))
            elif e.get("method") == "Network.requestWillBeSent":
                seen["requests"].append(str(p["request"]["url"]))
        return seen

    def evaluate(self, session: str, expression: str) -> Any:
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"measuring the page failed: {reply['exceptionDetails']}")
        return reply["result"]["value"]


MEASURE = r"""(() => {
  const doc = document.documentElement;
  const charts = [...document.querySelectorAll('svg')].map(svg => {
    const box = svg.getBoundingClientRect();
    const shapes = [...svg.querySelectorAll('rect, path, line')];
    return {
      label: svg.getAttribute('aria-label'), width: box.width, height: box.height, right: box.right,
      shapes: shapes.length,
      drawn: shapes.filter(s => { const b = s.getBBox(); return b.width > 0 || b.height > 0; }).length,
      markers: svg.querySelectorAll('path').length,
      barTitles: [...svg.querySelectorAll('rect > title')].map(t => t.textContent),
      texts: [...svg.querySelectorAll('text')].map(t => t.textContent),
    };
  });
  const tables = [...document.querySelectorAll('table')].map(t => {
    const box = t.parentElement;
    return {
      id: t.id, head: [...t.querySelectorAll('thead th')].map(th => th.textContent.trim()),
      rows: t.tBodies[0].rows.length, boxClass: box.className, boxOverflowX: getComputedStyle(box).overflowX,
      tableWidth: t.scrollWidth, boxWidth: box.clientWidth, boxRight: box.getBoundingClientRect().right,
    };
  });
  const addsUp = [...document.querySelectorAll('#adds-up tbody tr')].map(
    tr => [...tr.cells].map(td => ({text: td.textContent, s: td.dataset.s === undefined ? null : Number(td.dataset.s)})));
  return {title: document.title, innerWidth, scrollWidth: doc.scrollWidth, clientWidth: doc.clientWidth,
          charts, tables, addsUp, scripts: document.scripts.length, text: document.body.innerText};
})()"""

CANARY = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>canary</title></head><body>
<img src="missing-image.png" alt=""><script>console.error("canary console"); throw new Error("canary thrown");</script>
</body></html>"""


STEP_S = 300
SEED = 5
LIMIT_S = 3000.0


@pytest.fixture(scope="module")
def generated(module_spark: Any, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """report.html (and the tables) of a synthetic plant, written by ``job.run``."""
    root = tmp_path_factory.mktemp("browser")
    # 5-minute buckets keep Spark's part short; the report is the same kind of page.
    spec = SynthSpec(groups=4, days=2, step_s=STEP_S, incidents=5, seed=SEED, gaps=1, controller_restarts=1,
                     violation_fraction=0.5, start="2026-11-30T00:00:00Z", topics=3)
    synthesize(spec, out=root / "exports", formats=("query_range",))
    out = root / "sla"
    job.run(module_spark, job.JobConfig(inputs=(str(root / "exports" / "query_range"),), out=str(out), step_s=STEP_S,
                                 targets=Targets(incident_read_unavailable_s=LIMIT_S)),
            progress=lambda _msg: None)
    return out


def _live_members(pgid: int, wait_s: float = 5.0) -> list[int]:
    """Processes of process group ``pgid`` that are not zombies, after up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        live = []
        for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    live.append(int(stat.parent.name))
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(0.1)


def _rows(path: pathlib.Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_the_tables_keep_their_column_names(generated: pathlib.Path) -> None:
    """The CSV (and Parquet) columns are a contract: labels are for the HTML only."""
    with (generated / "incidents.csv").open(newline="") as fh:
        assert next(csv.reader(fh)) == T.INCIDENT_COLUMNS
    daily_columns = ["group", "day", "known_s", "unknown_s", "read_unavailable_s", "one_reader_violation_s",
                     "one_reader_unresolved_s", "incidents", "incidents_over_limit",
                     "max_incident_read_unavailable_s", "failovers_counted", "read_availability", "target",
                     "target_met"]
    with (generated / "daily.csv").open(newline="") as fh:
        assert next(csv.reader(fh)) == daily_columns
    with (generated / "monthly.csv").open(newline="") as fh:
        assert next(csv.reader(fh)) == ["group", "month", *daily_columns[2:]]


@needs_chromium
def test_the_report_renders_in_chromium_without_errors_and_every_chart_draws_its_data(
        generated: pathlib.Path, tmp_path: pathlib.Path) -> None:
    page = generated / "report.html"
    canary = tmp_path / "canary.html"
    canary.write_text(CANARY, encoding="utf-8")
    browser = Chromium(tmp_path / "profile", tmp_path / "chromium.log")
    try:
        session = browser.open_page()
        # the harness sees what it claims to check
        seen = browser.load(session, canary.as_uri())
        assert any("canary thrown" in e for e in seen["exceptions"]), seen
        assert any("canary console" in c for c in seen["console"]), seen
        assert any(u.endswith("/missing-image.png") for u in seen["requests"]), seen

        seen = browser.load(session, page.as_uri())
        assert seen["exceptions"] == [], seen
        assert seen["console"] == [], seen
        assert seen["log"] == [], seen
        assert seen["requests"] == [page.as_uri()], seen  # self-contained: nothing else fetched
        got = browser.evaluate(session, MEASURE)
        # a screenshot beside the test's files, for a person looking into a failure
        shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                            session=session)
        (tmp_path / "report.png").write_bytes(base64.b64decode(shot["data"]))
    finally:
        browser.stop()
    assert _live_members(browser.pid) == [], "chromium's processes outlived the test"

    incidents = _rows(generated / "incidents.csv")
    monthly = _rows(generated / "monthly.csv")
    assert got["title"] == "Understudy failover SLA report"
    assert got["scripts"] == 0
    assert len(incidents) >= 4

    # every chart drew, and drew the data
    charts = {c["label"]: c for c in got["charts"]}
    assert set(charts) == {"state timeline per group", "read-unavailable seconds per incident",
                           "error budget used per group", "topic availability timeline"}, charts.keys()
    for chart in charts.values():
        assert chart["width"] > 100, chart
        assert chart["height"] > 50, chart
        assert chart["right"] <= got["innerWidth"], chart  # scaled to the page, not off it
        assert chart["shapes"] > 0, chart
        assert chart["drawn"] == chart["shapes"], chart  # every shape has a rendered size
    timeline = charts["state timeline per group"]
    assert timeline["markers"] == len(incidents)  # one marker per incident
    assert {r["group"] for r in incidents} <= set(timeline["texts"])
    topic_chart = charts["topic availability timeline"]  # a row per topic, its outages drawn
    assert {r["topic"] for r in _rows(generated / "topics.csv")} == {"t00", "t01", "t02"}
    assert {"t00", "t01", "t02"} <= set(topic_chart["texts"])
    assert topic_chart["shapes"] > 6  # two lanes per topic and at least one outage
    histogram = charts["read-unavailable seconds per incident"]
    assert sum(int(t.rsplit(": ", 1)[1].split()[0]) for t in histogram["barTitles"]) == len(incidents)
    assert any(t.startswith(f"limit {LIMIT_S:,.0f} s") for t in histogram["texts"])
    budget = charts["error budget used per group"]
    judged = [r for r in monthly if r["group"] != "ALL"]  # one day of data in each month: judged
    assert sum(1 for t in budget["texts"] if t.endswith("%")) == len(judged)
    assert "100% of budget" in budget["texts"]

    # the page never scrolls sideways; wide tables scroll inside their own box
    assert got["scrollWidth"] <= got["clientWidth"], (got["scrollWidth"], got["clientWidth"])
    assert got["tables"]
    for table in got["tables"]:
        assert table["boxClass"] == "scroll", table
        assert table["boxOverflowX"] == "auto", table
        assert table["boxRight"] <= got["innerWidth"], table
        for header in table["head"]:
            assert header, table["head"]
            assert "_" not in header, (header, table["head"])
    assert any(t["tableWidth"] > t["boxWidth"] for t in got["tables"]), "no table needed its scroll box at 1000 px"
    heads = {h for t in got["tables"] for h in t["head"]}
    assert {report.LABELS["read_unavailable_s"], report.LABELS["master_lost_at"], report.LABELS["budget"]} <= heads
    assert {report.TOPIC_LABELS["write_availability"], report.TOPIC_LABELS["read_availability"]} <= heads

    # the rendered reconciliation adds up to the monthly total
    rows = {r[0]["text"]: [c["s"] for c in r if c["s"] is not None] for r in got["addsUp"]}
    everything = rows.pop("All groups")
    for name, seconds in [*rows.items(), ("All groups", everything)]:
        assert sum(seconds[:-1]) == pytest.approx(seconds[-1]), (name, seconds)
    assert [sum(col) for col in zip(*rows.values(), strict=True)] == pytest.approx(everything)
    total = sum(float(r["read_unavailable_s"]) for r in monthly if r["group"] == "ALL")
    assert everything[-1] == pytest.approx(total)
    assert sum(float(r["read_unavailable_s"]) for r in incidents) == pytest.approx(everything[0])
    assert "Read-unavailable over the whole window" in got["text"]
