"""Render the SLA tables as a self-contained HTML report and a Markdown summary.

Why this module exists: auditors open a file, often offline, often attached to a ticket.
So the report is one HTML file with inline SVG charts (no CDN, no script, no external
font) and a short Markdown summary for the PR or the ticket. The functions are pure:
small pandas frames in (already aggregated by Spark), text out.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from understudy_spark.transforms import (
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


def iso(ts: object) -> str:
    """ISO-8601 UTC with a ``Z``, or ``""`` for a missing time."""
    if ts is None or (isinstance(ts, float) and math.isnan(ts)) or ts is pd.NaT:
        return ""
    stamp = pd.Timestamp(str(ts)) if not isinstance(ts, pd.Timestamp) else ts
    if stamp.tzinfo is not None:
        stamp = stamp.tz_convert("UTC").tz_localize(None)
    return str(stamp.strftime("%Y-%m-%dT%H:%M:%SZ"))


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


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
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="state timeline per group">']
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
                    f'{iso(run.start)} .. {iso(run.end)} ({run.seconds:.0f} s)</title></rect>'
                )
        inc = inc_by_group.get(group)
        if inc is not None:
            for item in inc.itertuples(index=False):
                xm = x(item.master_lost_at)
                parts.append(
                    f'<path d="M{xm:.1f},{y - 3} l-3,-0 l3,5 l3,-5 z" fill="#000"><title>incident at '
                    f'{iso(item.master_lost_at)}: {item.read_unavailable_s:.0f} s unreadable</title></path>'
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
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="read-unavailable seconds per incident">']
    for i, c in enumerate(counts):
        h = (height - 2 * pad) * c / peak
        lo, hi = top * i / bins, top * (i + 1) / bins
        parts.append(
            f'<rect x="{pad + i * bar_w:.1f}" y="{height - pad - h:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
            f'fill="#3b6ea5"><title>{lo:.0f}-{hi:.0f} s: {c} incident(s)</title></rect>'
        )
    lx = pad + (width - 2 * pad) * limit / top
    parts.append(f'<line x1="{lx:.1f}" x2="{lx:.1f}" y1="{pad - 10}" y2="{height - pad}" stroke="#d7263d" stroke-dasharray="4"/>')
    parts.append(f'<text x="{lx + 3:.1f}" y="{pad - 12}" font-size="11" fill="#d7263d">limit {limit:.0f} s</text>')
    parts.append(f'<text x="{pad}" y="{height - 8}" font-size="11">0 s</text>')
    parts.append(f'<text x="{width - pad}" y="{height - 8}" font-size="11" text-anchor="end">{top:.0f} s</text>')
    parts.append("</svg>")
    return "".join(parts)


def attainment_svg(monthly: pd.DataFrame) -> str:
    """Error budget used per group and month (100 % = exactly at the availability target);
    red when the target is missed (budget or an incident over the limit)."""
    rows = monthly[monthly["group"] != OVERALL].copy()
    if rows.empty:
        return "<p>No groups.</p>"
    budget = (1.0 - rows["target"]) * rows["known_s"]
    rows["used"] = (rows["read_unavailable_s"] / budget.where(budget > 0)).fillna(0.0)
    rows = rows.sort_values("used", ascending=False).head(40)
    width, row_h, label_w = 640, 14, 130
    plot_w = width - label_w - 60
    top = max(1.0, float(rows["used"].max()))
    height = row_h * len(rows) + 24
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="error budget used per group">']
    for i, r in enumerate(rows.itertuples(index=False)):
        y = i * row_h + 2
        w = plot_w * float(r.used) / top
        colour = "#2e8b57" if bool(r.target_met) else "#d7263d"
        parts.append(f'<text x="0" y="{y + 10}" font-size="10" font-family="monospace">{_e(r.group)} {_e(r.month)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{max(w, 1.0):.1f}" height="{row_h - 3}" fill="{colour}"/>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 10}" font-size="10">{100 * float(r.used):.0f}%</text>')
    x100 = label_w + plot_w / top
    parts.append(f'<line x1="{x100:.1f}" x2="{x100:.1f}" y1="0" y2="{height - 20}" stroke="#000" stroke-dasharray="3"/>')
    parts.append(f'<text x="{x100:.1f}" y="{height - 6}" font-size="10" text-anchor="middle">100% of budget</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(frame: pd.DataFrame, *, limit: int | None = None) -> str:
    shown = frame if limit is None else frame.head(limit)
    head = "".join(f"<th>{_e(c)}</th>" for c in shown.columns)
    body = []
    for row in shown.itertuples(index=False):
        cells = []
        for value in row:
            if isinstance(value, pd.Timestamp):
                text = iso(value)
            elif isinstance(value, float):
                text = "" if math.isnan(value) else f"{value:.6g}"
            else:
                text = str(value)
            cells.append(f"<td>{_e(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = "" if limit is None or len(frame) <= limit else f"<p>{len(frame) - limit} more row(s) in the CSV/Parquet tables.</p>"
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


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


STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:8px 0}th,td{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#eee}td:first-child{text-align:left}.bad{color:#d7263d}.good{color:#2e8b57}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;font-size:12px}"""


def render_html(
    *, incidents: pd.DataFrame, daily: pd.DataFrame, monthly: pd.DataFrame, timeline: pd.DataFrame, meta: ReportMeta
) -> str:
    """The whole report as one self-contained HTML document."""
    overall = monthly[monthly["group"] == OVERALL]
    groups = pick_groups(incidents, daily)
    n_groups = daily["group"].nunique()
    legend = "".join(f'<span style="background:{c}">{_e(s)}</span>' for s, c in COLORS.items())
    missed = monthly[(monthly["group"] != OVERALL) & ~monthly["target_met"].astype(bool)]
    verdict = (
        '<p class="good">Every group met its targets.</p>'
        if missed.empty
        else f'<p class="bad">{len(missed)} group-month(s) missed the target.</p>'
    )
    inc_cols = [c for c in incidents.columns if c != "open"]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Understudy failover SLA report</title>
<style>{STYLE}</style></head><body>
<h1>Failover SLA report</h1>
<p>{_e(iso(meta.start))} to {_e(iso(meta.end))} &middot; {n_groups} group(s) &middot; step {meta.step_s:g} s &middot;
{meta.samples} samples read, {meta.rejected_lines} input line(s) rejected &middot;
targets: per-incident read unavailability &le; {meta.targets.incident_read_unavailable_s:g} s,
monthly read availability &ge; {100 * meta.targets.monthly_read_availability:g}%.</p>
{verdict}
<h2>Overall</h2>{_table(overall)}
<h2>State timeline</h2>
<p class="legend">{legend} &#9660; incident start. Showing {len(groups)} of {n_groups} group(s): those with unavailability, violations or unknown time.</p>
{timeline_svg(timeline, incidents, groups=groups, start=meta.start, end=meta.end)}
<h2>Read unavailability per incident</h2>
{histogram_svg([float(v) for v in incidents["read_unavailable_s"].tolist()], limit=meta.targets.incident_read_unavailable_s)}
<h2>SLA attainment (error budget used, worst first)</h2>
{attainment_svg(monthly)}
<h2>Incidents</h2>{_table(incidents[inc_cols], limit=MAX_INCIDENT_ROWS)}
<h2>Monthly per group</h2>{_table(monthly[monthly["group"] != OVERALL], limit=MAX_INCIDENT_ROWS)}
<p>Inputs: {_e(", ".join(meta.inputs))}</p>
</body></html>
"""


def render_summary(*, incidents: pd.DataFrame, monthly: pd.DataFrame, meta: ReportMeta) -> str:
    """A short Markdown summary."""
    lines = [
        "# Failover SLA summary",
        "",
        f"Period {iso(meta.start)} to {iso(meta.end)}, step {meta.step_s:g} s, "
        f"{meta.samples} samples, {meta.rejected_lines} rejected input line(s).",
        "",
        "| month | availability | unknown (s) | incidents | over limit | one-reader violation (s) "
        "| two readers, unresolved (s) | target met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in monthly[monthly["group"] == OVERALL].itertuples(index=False):
        avail = "n/a" if pd.isna(r.read_availability) else f"{100 * float(r.read_availability):.4f}%"
        lines.append(
            f"| {r.month} | {avail} | {float(r.unknown_s):.0f} | {int(r.incidents)} | "
            f"{int(r.incidents_over_limit)} | {float(r.one_reader_violation_s):.0f} | "
            f"{float(r.one_reader_unresolved_s):.0f} | {'yes' if r.target_met else 'no'} |"
        )
    missed = monthly[(monthly["group"] != OVERALL) & ~monthly["target_met"].astype(bool)]
    lines += ["", f"Groups missing the target: {len(missed)}."]
    if len(incidents):
        worst = incidents.sort_values("read_unavailable_s", ascending=False).head(5)
        lines += ["", "Worst incidents:", ""]
        for r in worst.itertuples(index=False):
            lines.append(f"- {r.group} at {iso(r.master_lost_at)}: {float(r.read_unavailable_s):.0f} s unreadable")
    return "\n".join(lines) + "\n"
