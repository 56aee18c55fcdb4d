"""Render the SLA tables as a self-contained HTML report and a Markdown summary.

Why this module exists: auditors open a file, often offline, often attached to a ticket.
So the report is one HTML file with inline SVG charts (no CDN, no script, no external
font) and a short Markdown summary for the PR or the ticket. The functions are pure:
small pandas frames in (already aggregated by Spark), text out.

What a person auditing a month relies on here:

- It adds up. The read-unavailable time of the whole window is shown as the sum of its
  parts: the incidents, plus the time that belongs to no incident (its own line, with its
  stretches listed), per group and for all groups. All three come from one per-bucket
  attribution (``transforms.incident_buckets``); seconds are printed exactly (to the
  millisecond, no exponent, no rounding to whole seconds), so the printed parts sum to the
  printed total.
- No extrapolation. The monthly error budget is judged only over at least
  ``MIN_BUDGET_WINDOW_S`` of data in the month; a shorter window shows what was measured
  and says it is too short to judge (``make demo`` covers ~30 s, and 3 s unreadable
  against a budget pro-rated to 28 s printed "11111 %").
- Words, not column names. Headers come from ``LABELS`` (the CSV/Parquet column name is
  the header's tooltip); the CSV and Parquet tables keep their column names.
- Wide tables scroll inside their section, charts scale down to the page width.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from understudy_spark.transforms import (
    OUTSIDE_COLUMNS,
    OVERALL,
    STATE_NORMAL,
    STATE_SLAVE_READ,
    STATE_TWO_READERS,
    STATE_UNKNOWN,
    STATE_UNREADABLE,
    Targets,
)

COLORS = {
    STATE_NORMAL: "#cfe8cf",
    STATE_SLAVE_READ: "#f2c14e",
    STATE_UNREADABLE: "#d7263d",
    STATE_TWO_READERS: "#6a0dad",
    STATE_UNKNOWN: "#9e9e9e",
}
MAX_TIMELINES = 60
MAX_INCIDENT_ROWS = 300
MAX_GROUP_ROWS = 60

# The monthly error budget is judged only when the month holds at least this much data
# (one day: the shortest period the targets are applied to, the daily table's). Over a
# shorter window a percentage of the budget extrapolates a few scrapes to a month.
MIN_BUDGET_WINDOW_S = 86400.0

# Column name (the CSV/Parquet contract) -> the header a person reads in the HTML.
LABELS: dict[str, str] = {
    "group": "Group",
    "month": "Month",
    "day": "Day",
    "master_lost_at": "Master lost",
    "reads_restored_at": "Reads restored",
    "master_back_at": "Master back",
    "normal_at": "Normal again",
    "read_unavailable_s": "Read-unavailable (s)",
    "failback_gap_s": "Failback gap (s)",
    "one_reader_violation_s": "Two readers, proven (s)",
    "one_reader_unresolved_s": "Two readers, unresolved (s)",
    "backsync_s": "Back-sync (s)",
    "unknown_s": "Unknown (s)",
    "duration_s": "Duration (s)",
    "open": "Still open",
    "known_s": "Known time (s)",
    "incidents": "Incidents",
    "incidents_over_limit": "Incidents over the limit",
    "max_incident_read_unavailable_s": "Worst incident, read-unavailable (s)",
    "failovers_counted": "Failovers counted",
    "read_availability": "Read availability (of known time)",
    "target": "Target",
    "target_met": "Target met",
    "start": "From",
    "end": "To",
    "budget": "Error budget used",
    "topic": "Topic",
    "write_availability": "Write availability (of known time)",
    "write_unavailable_s": "Not writable (s)",
    "read_partial_s": "Partly readable (s)",
    "read_none_s": "Not readable (s)",
    "write_available_s": "Writable (s)",
    "read_full_s": "Fully readable (s)",
    "consumer_group": "Consumer group",
    "buckets": "Steps with a lag sample",
    "lag_p50": "Lag p50 (messages)",
    "lag_p95": "Lag p95 (messages)",
    "lag_p99": "Lag p99 (messages)",
    "lag_max": "Lag max (messages)",
}
# The topic table's full-read availability reads differently from a group's.
TOPIC_LABELS = {**LABELS, "read_availability": "Full-read availability (of known time)"}


@dataclass(frozen=True, slots=True)
class ReportMeta:
    """Facts about the run shown in the report header."""

    inputs: Sequence[str]
    step_s: float
    targets: Targets
    samples: int
    rejected_lines: int
    start: pd.Timestamp
    end: pd.Timestamp
    # Per group, how exact its durations are (``transforms.event_resolution``'s reason).
    resolution: Sequence[tuple[str, str]] = ()


def iso(ts: object) -> str:
    """ISO-8601 UTC with a ``Z``, or ``""`` for a missing time; with milliseconds when the
    time has any (event times), without for whole seconds (bucket times)."""
    if ts is None or (isinstance(ts, float) and math.isnan(ts)) or ts is pd.NaT:
        return ""
    stamp = pd.Timestamp(str(ts)) if not isinstance(ts, pd.Timestamp) else ts
    if stamp.tzinfo is not None:
        stamp = stamp.tz_convert("UTC").tz_localize(None)
    ms = stamp.microsecond // 1000
    return str(stamp.strftime("%Y-%m-%dT%H:%M:%S")) + (f".{ms:03d}Z" if ms else "Z")


MAX_GROUPS_NAMED = 20


def resolution_lines(resolution: Sequence[tuple[str, str]]) -> list[str]:
    """One line per resolution (``durations exact (event times)``, or at scrape resolution
    and why), naming its groups: ``g1, g2: durations exact (event times).``"""
    by_reason: dict[str, list[str]] = {}
    for group, reason in resolution:
        by_reason.setdefault(reason, []).append(group)
    lines = []
    for reason, groups in sorted(by_reason.items(), key=lambda kv: (not kv[0].startswith("durations exact"), kv[0])):
        named = ", ".join(sorted(groups)[:MAX_GROUPS_NAMED])
        if len(groups) > MAX_GROUPS_NAMED:
            named += f" and {len(groups) - MAX_GROUPS_NAMED} more ({len(groups)} groups)"
        lines.append(f"{named}: {reason}.")
    return lines


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _number(value: object) -> float | None:
    """A finite float, or None for anything missing."""
    if value is None or value is pd.NaT or isinstance(value, (str, bytes, pd.Timestamp)):
        return None
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def fmt_seconds(value: object) -> str:
    """Seconds as a person reads them: exact to the millisecond (bucket times are whole
    milliseconds), thousands separated, never an exponent: ``2,592,015``, ``1.5``, ``0``.
    ``""`` for a missing value."""
    v = _number(value)
    if v is None:
        return ""
    text = f"{v:,.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def fmt_duration(value: object) -> str:
    """``fmt_seconds`` with the unit, and days/hours/minutes beside long ones:
    ``28 s``, ``7,200 s (2 h)``."""
    v = _number(value)
    if v is None:
        return ""
    text = f"{fmt_seconds(v)} s"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if abs(v) >= size:
            amount = f"{v / size:.1f}".removesuffix(".0")
            return f"{text} ({amount} {unit})"
    return text


def fmt_fraction(value: object) -> str:
    """A fraction as a percentage, cut (never rounded up) to four decimals, so 99.99999 %
    never reads 100 %: ``99.9653 %``."""
    v = _number(value)
    if v is None:
        return ""
    cut = math.floor(v * 1e6 + 1e-6) / 1e4
    return f"{cut:.4f}".rstrip("0").rstrip(".") + " %"


def _seconds_cell(value: object) -> str:
    v = _number(value)
    attr = "" if v is None else f' data-s="{v!r}"'
    return f'<td class="num"{attr}>{_e(fmt_seconds(v))}</td>'


def _cell(column: str, value: object) -> str:
    """One table cell in the form a person reads; seconds carry their exact value in
    ``data-s`` (the tests add the rendered parts up)."""
    if column.endswith("_s"):
        return _seconds_cell(value)
    if isinstance(value, pd.Timestamp) or column.endswith("_at") or column in ("start", "end"):
        return f"<td>{_e(iso(value))}</td>"
    if column in ("read_availability", "write_availability", "target"):
        return f'<td class="num">{_e(fmt_fraction(value))}</td>'
    if isinstance(value, (bool, np.bool_)):
        return f"<td>{'yes' if bool(value) else 'no'}</td>"
    if isinstance(value, (int, np.integer)):
        return f'<td class="num">{int(value):,}</td>'
    v = _number(value)
    if v is not None:
        return f'<td class="num">{_e(fmt_seconds(v))}</td>'
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "<td></td>"
    return f"<td>{_e(value)}</td>"


NUM = ' class="num"'
NUMERIC = {"incidents", "incidents_over_limit", "failovers_counted", "read_availability", "target",
           "write_availability", "buckets", "lag_p50", "lag_p95", "lag_p99", "lag_max"}


def _header(columns: Sequence[str], labels: Mapping[str, str] = LABELS) -> str:
    """Header cells in words; the CSV/Parquet column name is the tooltip."""
    cells = []
    for c in columns:
        cls = NUM if c.endswith("_s") or c in NUMERIC else ""
        cells.append(f'<th scope="col"{cls} title="{_e(c)}">{_e(labels.get(c, c))}</th>')
    return "".join(cells)


def _scroll(table: str, *, label: str) -> str:
    """A table in a box that scrolls sideways inside its section instead of the page."""
    return f'<div class="scroll" role="region" tabindex="0" aria-label="{_e(label)}">{table}</div>'


def _table(frame: pd.DataFrame, *, label: str, limit: int | None = None, labels: Mapping[str, str] = LABELS) -> str:
    shown = frame if limit is None else frame.head(limit)
    columns = [str(c) for c in shown.columns]
    body = []
    for row in shown.itertuples(index=False):
        body.append("<tr>" + "".join(_cell(c, v) for c, v in zip(columns, row, strict=True)) + "</tr>")
    more = (
        "" if limit is None or len(frame) <= limit
        else f"<p>{len(frame) - limit} more row(s) in the CSV/Parquet tables.</p>"
    )
    table = f"<table><thead><tr>{_header(columns, labels)}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return _scroll(table, label=label) + more


# --- the error budget -------------------------------------------------------------------


def _naive(ts: pd.Timestamp) -> pd.Timestamp:
    return ts.tz_convert("UTC").tz_localize(None) if ts.tzinfo is not None else ts


def month_window_s(month: str, start: pd.Timestamp, end: pd.Timestamp) -> float:
    """Seconds of the report's window ``[start, end)`` inside ``month`` (``yyyy-MM``)."""
    first = pd.Timestamp(f"{month}-01")
    after = first + pd.offsets.MonthBegin(1)
    lo, hi = max(_naive(start), first), min(_naive(end), after)
    return max(float((hi - lo).total_seconds()), 0.0)


class MonthRow(Protocol):
    """A row of the monthly table (``itertuples``) as the budget reads it."""

    group: object
    month: object
    known_s: object
    read_unavailable_s: object
    read_availability: object
    target: object
    target_met: object
    incidents_over_limit: object


@dataclass(frozen=True, slots=True)
class Budget:
    """The error budget of one monthly row, or why it is not judged."""

    judged: bool
    window_s: float
    allowed_s: float  # the budget pro-rated to the known time of the window
    used: float | None  # fraction of ``allowed_s`` used; None: not judged or no budget
    text: str
    detail: str = ""  # what the budget is, for a tooltip


def budget(row: MonthRow, meta: ReportMeta) -> Budget:
    """The error budget of a monthly row (``month, known_s, read_unavailable_s,
    target``). Judged only over at least ``MIN_BUDGET_WINDOW_S`` of data in the month;
    otherwise the text says the window is too short and nothing is extrapolated."""
    month = str(row.month)
    window = month_window_s(month, meta.start, meta.end)
    if window < MIN_BUDGET_WINDOW_S:
        return Budget(False, window, 0.0, None,
                      f"window {fmt_duration(window)}: too short to judge a monthly budget")
    known = _number(row.known_s) or 0.0
    unavailable = _number(row.read_unavailable_s) or 0.0
    target = _number(row.target)
    allowed = (1.0 - (target if target is not None else 1.0)) * known
    detail = (f"{fmt_duration(allowed)} may be read-unavailable in {fmt_duration(known)} of known time "
              f"at a {fmt_fraction(target)} target; {fmt_duration(unavailable)} was")
    if allowed <= 0:
        used = 0.0 if unavailable == 0 else None
        text = "0 %" if used == 0.0 else f"{fmt_duration(unavailable)}, no budget"
        return Budget(True, window, allowed, used, text, detail)
    used = unavailable / allowed
    pct = "0" if used == 0 else "< 1" if used < 0.01 else f"{100 * used:,.0f}"
    return Budget(True, window, allowed, used, f"{pct} % of {fmt_seconds(allowed)} s", detail)


def _target_text(row: MonthRow, b: Budget) -> str:
    over = int(_number(row.incidents_over_limit) or 0)
    if not b.judged:
        return f"no: {over} incident(s) over the limit" if over else "availability not judged (window too short)"
    if bool(row.target_met):
        return "yes"
    reasons = []
    availability, target = _number(row.read_availability), _number(row.target)
    if availability is not None and target is not None and availability < target:
        reasons.append("availability below the target")
    if over:
        reasons.append(f"{over} incident(s) over the limit")
    return "no: " + "; ".join(reasons) if reasons else "no"


def _monthly_table(rows: pd.DataFrame, meta: ReportMeta, *, label: str, limit: int | None = None) -> str:
    """Monthly rows with the budget and the target judged as ``budget`` says."""
    shown = rows if limit is None else rows.head(limit)
    # The verdict first, then what it rests on, then the rest of the row.
    first = ["group", "month", "target_met", "budget", "read_availability", "target", "read_unavailable_s", "known_s"]
    columns = [c for c in first if c in ("target_met", "budget") or c in shown.columns]
    columns += [str(c) for c in shown.columns if c not in first]
    body = []
    for row in shown.itertuples(index=False):
        b = budget(row, meta)
        cells = []
        for c in columns:
            if c == "target_met":
                cls = "" if not b.judged else (' class="good"' if bool(row.target_met) else ' class="bad"')
                cells.append(f"<td{cls}>{_e(_target_text(row, b))}</td>")
            elif c == "budget":
                title = f' title="{_e(b.detail)}"' if b.detail else ""
                cells.append(f"<td{title}>{_e(b.text)}</td>")
            elif c == "group" and row.group == OVERALL:
                cells.append("<td>All groups</td>")
            else:
                cells.append(_cell(c, getattr(row, c)))
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = (
        "" if limit is None or len(rows) <= limit
        else f"<p>{len(rows) - limit} more row(s) in the CSV/Parquet tables.</p>"
    )
    head = _header(columns)
    return _scroll(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>", label=label) + more


# --- where the read-unavailable time is ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tally:
    """Read-unavailable seconds of the whole window, by group, split into incidents and
    outside incidents; ``total`` is the daily table's sum."""

    group: str
    in_incidents_s: float
    incidents: int
    outside_s: float
    stretches: int
    total_s: float


def tally(daily: pd.DataFrame, incidents: pd.DataFrame, outside: pd.DataFrame) -> list[Tally]:
    """Per group: the daily total and its parts, from the three tables as written."""
    total = daily.groupby("group")["read_unavailable_s"].sum() if len(daily) else pd.Series(dtype=float)
    inc = incidents.groupby("group")["read_unavailable_s"].agg(["sum", "count"]) if len(incidents) else None
    out = outside.groupby("group")["read_unavailable_s"].agg(["sum", "count"]) if len(outside) else None
    groups = sorted(set(total.index) | set([] if inc is None else inc.index) | set([] if out is None else out.index))
    result = []
    for g in groups:
        result.append(Tally(
            group=str(g),
            in_incidents_s=float(inc.loc[g, "sum"]) if inc is not None and g in inc.index else 0.0,
            incidents=int(inc.loc[g, "count"]) if inc is not None and g in inc.index else 0,
            outside_s=float(out.loc[g, "sum"]) if out is not None and g in out.index else 0.0,
            stretches=int(out.loc[g, "count"]) if out is not None and g in out.index else 0,
            total_s=float(total.get(g, 0.0)),
        ))
    return result


def _sum(tallies: Sequence[Tally], group: str) -> Tally:
    return Tally(group, sum(t.in_incidents_s for t in tallies), sum(t.incidents for t in tallies),
                 sum(t.outside_s for t in tallies), sum(t.stretches for t in tallies),
                 sum(t.total_s for t in tallies))


def adds_up_html(daily: pd.DataFrame, incidents: pd.DataFrame, outside: pd.DataFrame) -> str:
    """The read-unavailable time of the whole window as the sum of its parts, per group
    and for all groups (``<table id="adds-up">``; each figure also in ``data-s``)."""
    tallies = tally(daily, incidents, outside)
    everything = _sum(tallies, "All groups")
    with_outside = everything.outside_s > 0 or everything.stretches > 0
    if with_outside:
        sentence = (
            f"Read-unavailable over the whole window: <b>{_e(fmt_duration(everything.total_s))}</b> = "
            f"{_e(fmt_duration(everything.in_incidents_s))} in {everything.incidents} incident(s) + "
            f"{_e(fmt_duration(everything.outside_s))} outside any incident ({everything.stretches} "
            "stretch(es), listed under &ldquo;Read-unavailable outside incidents&rdquo;)."
        )
    else:
        sentence = (
            f"Read-unavailable over the whole window: <b>{_e(fmt_duration(everything.total_s))}</b>, all of it "
            f"in the {everything.incidents} incident(s); none outside incidents."
        )
    busy = sorted((t for t in tallies if t.total_s or t.in_incidents_s or t.outside_s or t.incidents),
                  key=lambda t: (-t.total_s, t.group))
    quiet = [t for t in tallies if t not in busy]
    shown, folded = busy[:MAX_GROUP_ROWS], busy[MAX_GROUP_ROWS:] + quiet
    rows = [(t.group, t) for t in shown]
    if folded:
        rows.append((f"{len(folded)} other group(s)", _sum(folded, "other")))
    rows.append(("All groups", everything))
    columns = ["Group", "Incidents", "In incidents (s)"]
    if with_outside:
        columns += ["Outside incidents (s)"]
    columns += ["Total read-unavailable (s)"]
    body = []
    for name, t in rows:
        cells = [f"<td>{_e(name)}</td>", f'<td class="num">{t.incidents:,}</td>', _seconds_cell(t.in_incidents_s)]
        if with_outside:
            cells.append(_seconds_cell(t.outside_s))
        cells.append(_seconds_cell(t.total_s))
        cls = ' class="total"' if name == "All groups" else ""
        body.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    head = "".join(f'<th scope="col"{"" if c == "Group" else NUM}>{_e(c)}</th>' for c in columns)
    table = f'<table id="adds-up"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    return f"<p>{sentence}</p>" + _scroll(table, label="read-unavailable time by group")


# --- charts ---------------------------------------------------------------------------------


def _svg_open(width: int, height: int, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(label)}">')


def timeline_svg(
    timeline: pd.DataFrame, incidents: pd.DataFrame, *, groups: Sequence[str], start: pd.Timestamp, end: pd.Timestamp
) -> str:
    """One row per group: coloured state runs on a normal background, incidents marked."""
    width, label_w, row_h = 960, 80, 16
    span = max((end - start).total_seconds(), 1.0)
    plot_w = width - label_w - 10

    def x(ts: pd.Timestamp) -> float:
        return float(label_w + plot_w * (ts - start).total_seconds() / span)

    height = row_h * len(groups) + 30
    parts = [_svg_open(width, height, "state timeline per group")]
    by_group = {g: frame for g, frame in timeline.groupby("group")} if len(timeline) else {}
    inc_by_group = {g: frame for g, frame in incidents.groupby("group")} if len(incidents) else {}
    for row, group in enumerate(groups):
        y = row * row_h + 4
        parts.append(f'<text x="0" y="{y + 11}" font-size="11" font-family="monospace">{_e(group)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{row_h - 4}" fill="{COLORS[STATE_NORMAL]}"/>')
        runs = by_group.get(group)
        if runs is not None:
            for run in runs.itertuples(index=False):
                if run.state == STATE_NORMAL:
                    continue
                x0, x1 = x(run.start), x(run.end)
                parts.append(
                    f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1.0):.1f}" height="{row_h - 4}" '
                    f'fill="{COLORS.get(run.state, "#000")}"><title>{_e(group)} {_e(run.state)} '
                    f'{iso(run.start)} .. {iso(run.end)} ({_e(fmt_duration(run.seconds))})</title></rect>'
                )
        inc = inc_by_group.get(group)
        if inc is not None:
            for item in inc.itertuples(index=False):
                xm = x(item.master_lost_at)
                parts.append(
                    f'<path d="M{xm:.1f},{y - 3} l-3,-0 l3,5 l3,-5 z" fill="#000"><title>incident at '
                    f'{iso(item.master_lost_at)}: {_e(fmt_duration(item.read_unavailable_s))} read-unavailable'
                    "</title></path>"
                )
    y = row_h * len(groups) + 20
    parts.append(f'<text x="{label_w}" y="{y}" font-size="11">{_e(iso(start))}</text>')
    parts.append(f'<text x="{width - 10}" y="{y}" font-size="11" text-anchor="end">{_e(iso(end))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def histogram_svg(values: Sequence[float], *, limit: float) -> str:
    """Distribution of per-incident read-unavailable seconds, with the limit marked."""
    width, height, pad = 640, 220, 30
    if not values:
        return "<p>No incidents.</p>"
    top = max(max(values), limit) or 1.0
    bins = 12
    counts = [0] * bins
    for v in values:
        counts[min(int(v / top * bins), bins - 1)] += 1
    peak = max(counts)
    bar_w = (width - 2 * pad) / bins
    parts = [_svg_open(width, height, "read-unavailable seconds per incident")]
    for i, c in enumerate(counts):
        h = (height - 2 * pad) * c / peak
        lo, hi = top * i / bins, top * (i + 1) / bins
        parts.append(
            f'<rect x="{pad + i * bar_w:.1f}" y="{height - pad - h:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
            f'fill="#3b6ea5"><title>{_e(fmt_seconds(lo))}-{_e(fmt_seconds(hi))} s: {c} incident(s)</title></rect>'
        )
    lx = pad + (width - 2 * pad) * limit / top
    anchor, dx = ("end", -3) if lx > width / 2 else ("start", 3)
    parts.append(f'<line x1="{lx:.1f}" x2="{lx:.1f}" y1="{pad - 10}" y2="{height - pad}" stroke="#d7263d" stroke-dasharray="4"/>')
    parts.append(f'<text x="{lx + dx:.1f}" y="{pad - 12}" font-size="11" fill="#d7263d" '
                 f'text-anchor="{anchor}">limit {_e(fmt_seconds(limit))} s</text>')
    parts.append(f'<text x="{pad}" y="{height - 8}" font-size="11">0 s</text>')
    parts.append(f'<text x="{width - pad}" y="{height - 8}" font-size="11" text-anchor="end">'
                 f"{_e(fmt_seconds(top))} s</text>")
    parts.append("</svg>")
    return "".join(parts)


def attainment_svg(monthly: pd.DataFrame, meta: ReportMeta) -> str:
    """Error budget used per group and month (100 % = exactly at the availability target,
    the budget pro-rated to the month's known time); red when the target is missed
    (budget or an incident over the limit). Months with less than
    ``MIN_BUDGET_WINDOW_S`` of data are not drawn: a paragraph says the window is too short
    and gives the measured figures instead."""
    rows = monthly[monthly["group"] != OVERALL].copy()
    if rows.empty:
        return "<p>No groups.</p>"
    budgets = [budget(r, meta) for r in rows.itertuples(index=False)]
    rows["judged"] = [b.judged for b in budgets]
    rows["used"] = [b.used if b.used is not None else (math.inf if b.judged else 0.0) for b in budgets]
    notes = []
    for month, part in rows[~rows["judged"]].groupby("month"):
        window = month_window_s(str(month), meta.start, meta.end)
        known = float(part["known_s"].sum())
        unavailable = float(part["read_unavailable_s"].sum())
        readable = f" ({fmt_fraction(1.0 - unavailable / known)} of it readable)" if known > 0 else ""
        notes.append(
            f'<p class="note">{_e(month)}: window {_e(fmt_duration(window))}: too short to judge a monthly '
            f"budget (judged from {_e(fmt_duration(MIN_BUDGET_WINDOW_S))} of data in a month). Measured, "
            f"not extrapolated: {_e(fmt_duration(unavailable))} read-unavailable of "
            f"{_e(fmt_duration(known))} known time{readable}, over {part['group'].nunique()} group(s).</p>"
        )
    judged = rows[rows["judged"]]
    if judged.empty:
        return "".join(notes)
    judged = judged.sort_values("used", ascending=False).head(40)
    finite = [float(u) for u in judged["used"] if math.isfinite(float(u))]
    width, row_h, label_w = 640, 14, 130
    plot_w = width - label_w - 60
    top = max([1.0, *finite])
    height = row_h * len(judged) + 24
    parts = [_svg_open(width, height, "error budget used per group")]
    for i, r in enumerate(judged.itertuples(index=False)):
        y = i * row_h + 2
        used = float(r.used)
        w = plot_w * min(used, top) / top
        colour = "#2e8b57" if bool(r.target_met) else "#d7263d"
        label = "no budget" if not math.isfinite(used) else f"{100 * used:,.0f}%"
        parts.append(f'<text x="0" y="{y + 10}" font-size="10" font-family="monospace">{_e(r.group)} {_e(r.month)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{max(w, 1.0):.1f}" height="{row_h - 3}" fill="{colour}"/>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 10}" font-size="10">{_e(label)}</text>')
    x100 = label_w + plot_w / top
    parts.append(f'<line x1="{x100:.1f}" x2="{x100:.1f}" y1="0" y2="{height - 20}" stroke="#000" stroke-dasharray="3"/>')
    parts.append(f'<text x="{x100:.1f}" y="{height - 6}" font-size="10" text-anchor="middle">100% of budget</text>')
    parts.append("</svg>")
    return "".join(parts) + "".join(notes)


def pick_groups(incidents: pd.DataFrame, daily: pd.DataFrame) -> list[str]:
    """Groups worth a timeline: worst read unavailability first, then violations and
    unknown time; at most ``MAX_TIMELINES``."""
    score = daily.groupby("group")[["read_unavailable_s", "one_reader_violation_s", "unknown_s"]].sum()
    score = score[(score > 0).any(axis=1)].sort_values(
        ["read_unavailable_s", "one_reader_violation_s", "unknown_s"], ascending=False
    )
    chosen = list(score.index[:MAX_TIMELINES])
    for g in incidents["group"].unique().tolist() if len(incidents) else []:
        if g not in chosen and len(chosen) < MAX_TIMELINES:
            chosen.append(g)
    return sorted(chosen)


# --- topics ---------------------------------------------------------------------------------

TOPIC_COLORS = {"ok": COLORS[STATE_NORMAL], "partial": COLORS[STATE_SLAVE_READ], "down": COLORS[STATE_UNREADABLE],
                "unknown": COLORS[STATE_UNKNOWN]}
MAX_TOPIC_ROWS = 40
MAX_TOPIC_SEGMENTS = 20_000  # not fully available stretches handed to the chart


def _topic_lanes(seg: Any) -> tuple[str | None, str | None]:
    """What one topic segment draws: (write lane, read lane) colour keys; None = normal."""
    if bool(seg.unknown):
        return "unknown", "unknown"
    write = None if bool(seg.write_ok) else "down"
    read = None if bool(seg.read_full) else ("partial" if bool(seg.read_partial) else "down")
    return write, read


def topic_svg(segments: pd.DataFrame, topics: Sequence[str], *, start: pd.Timestamp, end: pd.Timestamp) -> str:
    """One row per topic, two lanes: writes (red: no queue writable) and reads (yellow: some
    queues not readable, red: none readable); grey where unknown. ``segments``: the
    topic's segments that are not fully available (``t0, t1`` in ms)."""
    width, label_w, lane_h = 960, 110, 7
    row_h = 2 * lane_h + 6
    span_ms = max((end - start).total_seconds() * 1000.0, 1.0)
    start_ms = start.value / 1e6
    plot_w = width - label_w - 10

    def x(t_ms: float) -> float:
        return float(label_w + plot_w * min(max(t_ms - start_ms, 0.0), span_ms) / span_ms)

    height = row_h * len(topics) + 30
    parts = [_svg_open(width, height, "topic availability timeline")]
    by_topic = {t: f for t, f in segments.groupby("topic")} if len(segments) else {}
    for row, topic in enumerate(topics):
        y = row * row_h + 4
        parts.append(f'<text x="0" y="{y + 11}" font-size="11" font-family="monospace">{_e(topic)}</text>')
        for lane in range(2):
            parts.append(f'<rect x="{label_w}" y="{y + lane * lane_h}" width="{plot_w}" height="{lane_h - 1}" '
                         f'fill="{TOPIC_COLORS["ok"]}"/>')
        seg = by_topic.get(topic)
        for item in seg.itertuples(index=False) if seg is not None else ():
            x0, x1 = x(float(item.t0)), x(float(item.t1))
            when = f"{iso(pd.Timestamp(int(item.t0), unit='ms'))} .. {iso(pd.Timestamp(int(item.t1), unit='ms'))}"
            secs = fmt_duration((int(item.t1) - int(item.t0)) / 1000.0)
            for lane, (key, what) in enumerate(zip(_topic_lanes(item), ("writes", "reads"), strict=True)):
                if key is None:
                    continue
                text = {"unknown": "unknown", "down": f"no {what}", "partial": "some queues not readable"}[key]
                parts.append(
                    f'<rect x="{x0:.1f}" y="{y + lane * lane_h}" width="{max(x1 - x0, 1.0):.1f}" height="{lane_h - 1}" '
                    f'fill="{TOPIC_COLORS[key]}"><title>{_e(topic)} {_e(text)} {_e(when)} ({_e(secs)})</title></rect>'
                )
    y = row_h * len(topics) + 20
    parts.append(f'<text x="{label_w}" y="{y}" font-size="11">{_e(iso(start))}</text>')
    parts.append(f'<text x="{width - 10}" y="{y}" font-size="11" text-anchor="end">{_e(iso(end))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def topic_section(topics: pd.DataFrame | None, segments: pd.DataFrame | None, lag: pd.DataFrame | None,
                  meta: ReportMeta) -> str:
    """The topic section (docs/sla.md "Topic SLA"): verdicts, the timeline chart (worst
    topics first), the monthly table, consumer lag. Without topic series, one sentence."""
    if topics is None or topics.empty:
        return ("<section><h2>Topics</h2><p class=\"note\">No topic placement series "
                "(understudy_topic_queue_info) in the input: no per-topic SLA.</p></section>")
    segments = segments if segments is not None else pd.DataFrame(columns=["topic", "t0", "t1"])
    score = topics.groupby("topic")[["write_unavailable_s", "read_none_s", "read_partial_s", "unknown_s"]].sum()
    ranked = score.sort_values(["write_unavailable_s", "read_none_s", "read_partial_s", "unknown_s"],
                               ascending=False).index.tolist()
    shown = ranked[:MAX_TOPIC_ROWS]
    missed = topics[~topics["target_met"].astype(bool)]
    verdict = (f'<p class="good">Every topic met its target in every month ({len(topics)} topic-month(s)).</p>'
               if missed.empty else f'<p class="bad">{len(missed)} topic-month(s) missed the target: '
               + _e(", ".join(f"{r.topic} {r.month}" for r in missed.head(20).itertuples(index=False))) + ".</p>")
    legend = "".join(f'<span style="background:{TOPIC_COLORS[k]}">{_e(t)}</span>' for k, t in
                     (("ok", "available"), ("partial", "some queues not readable"), ("down", "not writable / not readable"),
                      ("unknown", "unknown")))
    lag_part = "" if lag is None or lag.empty else (
        "<h3>Consumer lag (messages, summed over the topic's queues per step)</h3>"
        + _table(lag, label="consumer lag", limit=MAX_INCIDENT_ROWS, labels=TOPIC_LABELS))
    targets = meta.targets
    named = ", ".join(f"{t} {fmt_fraction(v)}" for t, v in targets.topic_targets)
    return f"""<section><h2>Topics</h2>
<p>Per topic: writes are available while some queue is on a group with a broker holding WRITE;
reads are full while every queue is on a readable group. Target: both &ge; {_e(fmt_fraction(targets.topic_availability))}{_e(f" ({named})" if named else "")}.
Writes are judged at scrape resolution; reads to the millisecond for groups with event times.</p>
{verdict}
<p class="legend">{legend} Upper lane writes, lower lane reads. Showing {len(shown)} of {len(ranked)} topic(s), worst first.</p>
{topic_svg(segments, shown, start=meta.start, end=meta.end)}
{_table(topics, label="topics per month", limit=MAX_INCIDENT_ROWS, labels=TOPIC_LABELS)}
{lag_part}</section>"""


STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
section{min-width:0}
.scroll{overflow-x:auto;max-width:100%;margin:8px 0}
table{border-collapse:collapse;font-size:12px;margin:0}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#eee;font-weight:600;max-width:9em;white-space:normal}
td{white-space:nowrap}.num{text-align:right}
tr.total td{font-weight:600;border-top:2px solid #888}
.chart{max-width:100%;height:auto;display:block}
.bad{color:#d7263d}.good{color:#2e8b57}.note{color:#555}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;font-size:12px}"""


def _empty_outside() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64" if c.endswith("_s") else "object") for c in OUTSIDE_COLUMNS})


def render_html(
    *,
    incidents: pd.DataFrame,
    daily: pd.DataFrame,
    monthly: pd.DataFrame,
    timeline: pd.DataFrame,
    outside: pd.DataFrame | None,
    meta: ReportMeta,
    topics: pd.DataFrame | None = None,
    topic_segments: pd.DataFrame | None = None,
    consumer_lag: pd.DataFrame | None = None,
) -> str:
    """The whole report as one self-contained HTML document. ``outside`` is
    ``transforms.outside_incidents`` (``None``: there is none); ``topics`` the monthly topic
    table (``None``: no topic series), ``topic_segments`` its not fully available stretches,
    ``consumer_lag`` the lag table (``understudy_spark.topics``)."""
    outside = _empty_outside() if outside is None else outside
    overall = monthly[monthly["group"] == OVERALL]
    per_group = monthly[monthly["group"] != OVERALL]
    groups = pick_groups(incidents, daily)
    n_groups = daily["group"].nunique()
    legend = "".join(f'<span style="background:{c}">{_e(s)}</span>' for s, c in COLORS.items())
    limit = meta.targets.incident_read_unavailable_s
    over = int((incidents["read_unavailable_s"] > limit).sum()) if len(incidents) else 0
    judged = [bool(budget(r, meta).judged) for r in per_group.itertuples(index=False)]
    missed = per_group[[j and not bool(m) for j, m in zip(judged, per_group["target_met"], strict=True)]]
    verdicts = []
    if any(judged):
        verdicts.append(
            '<p class="good">Every group met its targets in every month judged.</p>' if missed.empty
            else f'<p class="bad">{len(missed)} group-month(s) missed the target.</p>'
        )
    if not all(judged):
        window = (meta.end - meta.start).total_seconds()
        verdicts.append(
            f'<p class="note">Window {_e(fmt_duration(window))}'
            + (": too short to judge the monthly availability target" if not any(judged)
               else ": some months hold too little data to judge the monthly availability target")
            + f" (it is judged from {_e(fmt_duration(MIN_BUDGET_WINDOW_S))} of data in a month); "
            "the figures below are measured, not extrapolated.</p>"
        )
    verdicts.append(
        f'<p class="{"bad" if over else "good"}">{over} of {len(incidents)} incident(s) over the '
        f"{_e(fmt_seconds(limit))} s per-incident limit.</p>"
    )
    inc_cols = list(incidents.columns)
    outside_section = (
        "" if outside.empty else
        "<section><h2>Read-unavailable outside incidents</h2>"
        "<p>Known time in which no broker could read, but no failover incident was under way "
        "(for example a group stopped, or nobody readable while the mode stayed NORMAL).</p>"
        + _table(outside[OUTSIDE_COLUMNS].sort_values(["group", "start"]), label="read-unavailable outside incidents",
                 limit=MAX_INCIDENT_ROWS)
        + "</section>"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Understudy failover SLA report</title>
<style>{STYLE}</style></head><body>
<h1>Failover SLA report</h1>
<p>{_e(iso(meta.start))} to {_e(iso(meta.end))} ({_e(fmt_duration((meta.end - meta.start).total_seconds()))})
&middot; {n_groups} group(s) &middot; step {_e(fmt_seconds(meta.step_s))} s &middot;
{meta.samples:,} samples read, {meta.rejected_lines:,} input line(s) rejected &middot;
targets: per-incident read unavailability &le; {_e(fmt_seconds(limit))} s,
monthly read availability &ge; {_e(fmt_fraction(meta.targets.monthly_read_availability))}.</p>
{"".join(f'<p class="note">{_e(line)}</p>' for line in resolution_lines(meta.resolution))}
{"".join(verdicts)}
<section><h2>Overall</h2>{_monthly_table(overall, meta, label="overall per month")}
<h3>Where the read-unavailable time is</h3>
{adds_up_html(daily, incidents, outside)}</section>
<section><h2>State timeline</h2>
<p class="legend">{legend} &#9660; incident start. Showing {len(groups)} of {n_groups} group(s): those with unavailability, violations or unknown time.</p>
{timeline_svg(timeline, incidents, groups=groups, start=meta.start, end=meta.end)}</section>
<section><h2>Read unavailability per incident</h2>
{histogram_svg([float(v) for v in incidents["read_unavailable_s"].tolist()], limit=limit)}</section>
<section><h2>SLA attainment (error budget used, worst first)</h2>
{attainment_svg(monthly, meta)}</section>
<section><h2>Incidents</h2>{_table(incidents[inc_cols], label="incidents", limit=MAX_INCIDENT_ROWS)}</section>
{outside_section}
<section><h2>Monthly per group</h2>{_monthly_table(per_group, meta, label="monthly per group", limit=MAX_INCIDENT_ROWS)}</section>
{topic_section(topics, topic_segments, consumer_lag, meta)}
<p>Inputs: {_e(", ".join(meta.inputs))}</p>
</body></html>
"""


def render_summary(
    *, incidents: pd.DataFrame, monthly: pd.DataFrame, meta: ReportMeta, outside: pd.DataFrame | None = None,
    topics: pd.DataFrame | None = None,
) -> str:
    """A short Markdown summary."""
    lines = [
        "# Failover SLA summary",
        "",
        f"Period {iso(meta.start)} to {iso(meta.end)}, step {fmt_seconds(meta.step_s)} s, "
        f"{meta.samples} samples, {meta.rejected_lines} rejected input line(s).",
        *(["", *resolution_lines(meta.resolution)] if meta.resolution else []),
        "",
        "| month | availability | unknown (s) | incidents | over limit | one-reader violation (s) "
        "| two readers, unresolved (s) | target met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    overall = monthly[monthly["group"] == OVERALL]
    for r in overall.itertuples(index=False):
        avail = "n/a" if pd.isna(r.read_availability) else fmt_fraction(r.read_availability)
        b = budget(r, meta)
        met = ("yes" if r.target_met else "no") if b.judged else _target_text(r, b)
        lines.append(
            f"| {r.month} | {avail} | {fmt_seconds(r.unknown_s)} | {int(r.incidents)} | "
            f"{int(r.incidents_over_limit)} | {fmt_seconds(r.one_reader_violation_s)} | "
            f"{fmt_seconds(r.one_reader_unresolved_s)} | {met} |"
        )
    total = float(overall["read_unavailable_s"].sum()) if len(overall) else 0.0
    in_incidents = float(incidents["read_unavailable_s"].sum()) if len(incidents) else 0.0
    outside_s = float(outside["read_unavailable_s"].sum()) if outside is not None and len(outside) else 0.0
    split = f"{fmt_duration(in_incidents)} in {len(incidents)} incident(s)"
    if outside is not None and len(outside):
        split += f" + {fmt_duration(outside_s)} outside incidents ({len(outside)} stretch(es))"
    lines += ["", f"Read-unavailable: {fmt_duration(total)} = {split}."]
    short = [r.month for r in overall.itertuples(index=False) if not budget(r, meta).judged]
    if short:
        window = fmt_duration((meta.end - meta.start).total_seconds())
        lines.append(f"Window {window}: too short to judge a monthly budget in {', '.join(map(str, short))}.")
    missed = monthly[(monthly["group"] != OVERALL) & ~monthly["target_met"].astype(bool)]
    counted = [budget(r, meta).judged or int(r.incidents_over_limit) > 0 for r in missed.itertuples(index=False)]
    missed = missed.loc[np.array(counted, dtype=bool)]
    lines += ["", f"Groups missing the target: {len(missed)}."]
    if topics is not None and len(topics):
        lines += ["", "| topic | month | write availability | full-read availability | partly readable (s) | target met |",
                  "|---|---|---|---|---|---|"]
        for r in topics.itertuples(index=False):
            w = "n/a" if pd.isna(r.write_availability) else fmt_fraction(r.write_availability)
            rd = "n/a" if pd.isna(r.read_availability) else fmt_fraction(r.read_availability)
            lines.append(f"| {r.topic} | {r.month} | {w} | {rd} | {fmt_seconds(r.read_partial_s)} | "
                         f"{'yes' if r.target_met else 'no'} |")
    if len(incidents):
        worst = incidents.sort_values("read_unavailable_s", ascending=False).head(5)
        lines += ["", "Worst incidents:", ""]
        for r in worst.itertuples(index=False):
            lines.append(f"- {r.group} at {iso(r.master_lost_at)}: {fmt_duration(r.read_unavailable_s)} read-unavailable")
    return "\n".join(lines) + "\n"
