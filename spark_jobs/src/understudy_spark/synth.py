"""Synthetic Prometheus exports with a ground truth, for tests and benchmarks.

Why this module exists: an SLA job can only be trusted if it finds incidents we put
there ourselves, in every export form, through everything real exports contain: scrape
gaps, pods restarting under new ``instance``/``pod`` labels, controller restarts that
reset counters, duplicate and out-of-order samples, staleness markers. This module plans
those events (pure, seeded), renders the per-bucket series with numpy, and streams them
out one UTC day per file, so a month of 200 groups is written without holding it in
memory or formatting samples one Python call at a time.

Each group has a controller (``understudy_group_mode``, ``understudy_failover_total``) and
a master plus ``slaves`` slaves (``understudy_broker_permission``, ``up``). An injected
incident, in buckets of one step::

    b0        master dies: FENCING, nobody reads                (master_lost_at)
    b1        SLAVE_CONSUME: the acting slave reads              (reads_restored_at)
    b2        master back under a new pod (label churn), NONE    (master_back_at)
              [optionally READ for v buckets: two readers; the job proves a
               one-reader violation from v >= 2, one bucket stays unresolved]
    b3        RECOVERING: the slave drops READ, back-sync runs
    b4        NORMAL, master FULL                                 (normal_at)

With ``event_times`` the controller and the brokers also export the event-time gauges
(docs/sla.md "Event times"): every transition above happens at an instant shortly before
its bucket starts (inside the last tenth of the bucket before, after that bucket's
scrapes), so the samples are exactly those without the flag, and ``ground_truth.json``
adds each incident's ``exact`` figures, to the millisecond. Without the flag the output
is byte for byte what it was before the flag existed.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from understudy_broker import metric_names as names

FORMATS = ("query_range", "dump", "openmetrics")

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class SynthSpec:
    """What to generate. ``incidents`` and ``gaps`` are totals over all groups."""

    groups: int
    days: int
    step_s: int = 15
    incidents: int = 10
    seed: int = 1
    slaves: int = 1
    gaps: int = -1  # -1: half as many as incidents, at least one
    controller_restarts: int = -1  # -1: a quarter as many as groups, at least one
    duplicate_fraction: float = 0.001
    violation_fraction: float = 0.2
    start: str = "2026-11-01T00:00:00Z"
    event_times: bool = False
    topics: int = 0  # topic_plans: even ones on two groups, odd ones on one
    queues_per_group: int = 2

    def __post_init__(self) -> None:
        if self.groups < 1 or self.days < 1:
            raise ValueError("groups and days must be at least 1")
        if self.step_s < 1 or 86400 % self.step_s:
            raise ValueError(f"step {self.step_s}s must divide a day")
        if self.incidents < 0:
            raise ValueError("incidents must not be negative")

    @property
    def buckets_per_day(self) -> int:
        return 86400 // self.step_s

    @property
    def start_ms(self) -> int:
        when = dt.datetime.fromisoformat(self.start.replace("Z", "+00:00"))
        return int(when.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Incident:
    """One injected failover, in buckets (see the module docstring)."""

    group: int
    b0: int
    b1: int
    b2: int
    violation: int
    b3: int
    b4: int


@dataclass(frozen=True, slots=True)
class Gap:
    """Buckets ``[start, end)`` of a group with no scrape at all (unknown time)."""

    group: int
    start: int
    end: int


@dataclass(slots=True)
class Plan:
    """Everything injected, in buckets."""

    spec: SynthSpec
    incidents: list[Incident] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    resets: list[tuple[int, int]] = field(default_factory=list)  # (group, bucket)


def plan(spec: SynthSpec) -> Plan:
    """Place incidents, gaps and controller restarts; each in its own slot of its group's
    timeline so none overlaps another (pure, seeded)."""
    rng = np.random.default_rng(spec.seed)
    total = spec.days * spec.buckets_per_day
    n_gaps = spec.gaps if spec.gaps >= 0 else max(1, spec.incidents // 2)
    n_resets = (
        spec.controller_restarts if spec.controller_restarts >= 0 else max(1, spec.groups // 4)
    )
    kinds = ["incident"] * spec.incidents + ["gap"] * n_gaps + ["reset"] * n_resets
    owners = rng.integers(0, spec.groups, size=len(kinds))
    per_group: dict[int, list[str]] = {}
    for kind, owner in zip(kinds, owners.tolist(), strict=True):
        per_group.setdefault(int(owner), []).append(kind)
    result = Plan(spec=spec)
    for group, events in sorted(per_group.items()):
        order = rng.permutation(len(events))
        slot = total // (len(events) + 1)
        if slot < 120:
            raise ValueError(
                f"too many events for group {group}: {len(events)} in {total} buckets; "
                "use more days or fewer incidents"
            )
        for index, event_i in enumerate(order.tolist()):
            kind = events[event_i]
            base = (index + 1) * slot - slot // 2 + int(rng.integers(-slot // 4, slot // 4 + 1))
            if kind == "incident":
                b0 = base
                b1 = b0 + int(rng.integers(1, 4))
                b2 = b1 + int(rng.integers(4, 30))
                violation = int(rng.integers(1, 3)) if rng.random() < spec.violation_fraction else 0
                b3 = b2 + violation + int(rng.integers(2, 10))
                b4 = b3 + int(rng.integers(1, 5))
                result.incidents.append(Incident(group, b0, b1, b2, violation, b3, b4))
            elif kind == "gap":
                result.gaps.append(Gap(group, base, base + int(rng.integers(2, 40))))
            else:
                result.resets.append((group, base))
    return result


@dataclass(slots=True)
class Series:
    """One Prometheus series: constant labels, sorted buckets, finite values, and the
    buckets where a staleness marker follows its end."""

    labels: dict[str, str]
    buckets: IntArray
    values: FloatArray
    stale: IntArray
    offset_ms: int
    timestamps: bool = False  # values are instants in seconds: written to the millisecond


def group_name(group: int) -> str:
    return f"g{group:04d}"


def _segments(gen: IntArray, keep: npt.NDArray[np.bool_]) -> Iterator[tuple[int, IntArray]]:
    for g in np.unique(gen).tolist():
        idx = np.flatnonzero((gen == g) & keep).astype(np.int64)
        if idx.size:
            yield int(g), idx


@dataclass(slots=True)
class GroupArrays:
    """One group's state per bucket, from the plan."""

    mode: IntArray
    master_perm: FloatArray  # NaN: the master is dead (no permission series)
    master_alive: npt.NDArray[np.bool_]
    slave_perm: FloatArray
    master_gen: IntArray
    inc: IntArray
    scraped: npt.NDArray[np.bool_]


def group_arrays(p: Plan, group: int) -> GroupArrays:
    """The per-bucket mode, permissions, liveness and scrapes of ``group`` (pure)."""
    spec = p.spec
    total = spec.days * spec.buckets_per_day
    mode = np.zeros(total, dtype=np.int64)
    master_perm = np.full(total, 3.0)
    master_alive = np.ones(total, dtype=bool)
    slave_perm = np.zeros(total)
    master_gen = np.zeros(total, dtype=np.int64)
    inc = np.zeros(total, dtype=np.int64)
    scraped = np.ones(total, dtype=bool)
    for i in (x for x in p.incidents if x.group == group):
        mode[i.b0 : i.b1] = 1
        mode[i.b1 : i.b3] = 2
        mode[i.b3 : i.b4] = 3
        master_alive[i.b0 : i.b2] = False
        master_perm[i.b0 : i.b2] = np.nan
        master_perm[i.b2 : i.b2 + i.violation] = 3.0
        master_perm[i.b2 + i.violation : i.b4] = 0.0
        slave_perm[i.b1 : i.b3] = 1.0
        master_gen[i.b2 :] += 1
        inc[i.b1] += 1
    for gap in (x for x in p.gaps if x.group == group):
        scraped[gap.start : gap.end] = False
    return GroupArrays(mode, master_perm, master_alive, slave_perm, master_gen, inc, scraped)


def render_group(p: Plan, group: int, rng: np.random.Generator) -> list[Series]:
    """The series of one group over the whole period, from the plan."""
    spec = p.spec
    total = spec.days * spec.buckets_per_day
    step_ms = spec.step_s * 1000
    name = group_name(group)
    a = group_arrays(p, group)
    mode, master_perm, master_alive, slave_perm = a.mode, a.master_perm, a.master_alive, a.slave_perm
    master_gen, inc, scraped = a.master_gen, a.inc, a.scraped
    ctl_gen = np.zeros(total, dtype=np.int64)
    counter = np.cumsum(inc).astype(np.float64)
    for g, at in p.resets:
        if g == group:
            ctl_gen[at:] += 1
            counter[at:] -= counter[at - 1]

    def offset() -> int:
        return int(rng.integers(0, int(step_ms * 0.7)))

    ev = group_events(p, group) if spec.event_times else None

    out: list[Series] = []
    for gen, idx in _segments(ctl_gen, scraped):
        instance = f"ctl-{group}-{gen}:9300"
        labels = {"group": name, "instance": instance, "job": "understudy-controller"}
        stale = np.array([idx[-1] + 1] if idx[-1] + 1 < total else [], dtype=np.int64)
        off = offset()
        out.append(Series({"__name__": names.GROUP_MODE, **labels}, idx, mode[idx].astype(np.float64), stale, off))
        out.append(Series({"__name__": names.FAILOVER_TOTAL, **labels}, idx, counter[idx], stale, off))
        if ev is not None:
            out += ev.controller_series(labels, gen, first=int(np.flatnonzero(ctl_gen == gen)[0]),
                                        idx=idx, mode=mode, off=off)
    brokers = [(0, "master", master_gen, master_perm, master_alive)]
    for s in range(1, spec.slaves + 1):
        brokers.append((s, "slave", np.zeros(total, dtype=np.int64), slave_perm if s == 1 else np.zeros(total), np.ones(total, dtype=bool)))
    for ordinal, role, gens, perm, alive in brokers:
        broker = f"{name}-{ordinal}"
        for gen, idx in _segments(gens, scraped):
            labels = {
                "group": name,
                "broker": broker,
                "role": role,
                "instance": f"10.{group // 250}.{group % 250}.{ordinal * 16 + gen % 16}:9400",
                "pod": f"{broker}-{gen}",
                "job": "understudy-broker",
            }
            off = offset()
            up = alive[idx].astype(np.float64)
            out.append(Series({"__name__": "up", **labels}, idx, up, np.zeros(0, dtype=np.int64), off))
            present = idx[~np.isnan(perm[idx])]
            ends = present[np.flatnonzero(np.diff(present) > 1)] + 1
            if present.size and present[-1] + 1 < total:
                ends = np.append(ends, present[-1] + 1)
            out.append(Series({"__name__": names.BROKER_PERMISSION, **labels}, present, perm[present], ends.astype(np.int64), off))
            if ev is not None:
                out += ev.broker_series(labels, ordinal, gen, idx=idx[alive[idx]], off=off)
    return out


# ------------------------------------------------------------------------------ topics

@dataclass(frozen=True, slots=True)
class TopicPlan:
    """Topic ``name``: its queues (``queues[q]`` is the group of queue ``q``), from bucket
    ``first`` on, read by one consumer group ``cg-<name>``."""

    name: str
    queues: tuple[int, ...]
    first: int

    @property
    def consumer_group(self) -> str:
        return f"cg-{self.name}"


def topic_plans(spec: SynthSpec) -> list[TopicPlan]:
    """An even topic ``k`` spreads ``queues_per_group`` queues over groups ``k`` and ``k + 1``
    (mod the groups: its writes survive one group's failover), an odd one lives on group
    ``k`` alone; with two topics or more, the last one is created a quarter into the period."""
    total = spec.days * spec.buckets_per_day
    out = []
    for k in range(spec.topics):
        groups = list(dict.fromkeys([k % spec.groups, (k + 1) % spec.groups] if k % 2 == 0 else [k % spec.groups]))
        queues = tuple(g for g in groups for _ in range(spec.queues_per_group))
        first = total // 4 if spec.topics >= 2 and k == spec.topics - 1 else 0
        out.append(TopicPlan(f"t{k:02d}", queues, first))
    return out


def _writable(a: GroupArrays) -> npt.NDArray[np.bool_]:
    perm = np.nan_to_num(a.master_perm, nan=0.0).astype(np.int64)
    out: npt.NDArray[np.bool_] = a.scraped & ((perm & 2) == 2)
    return out


def _readable(a: GroupArrays) -> npt.NDArray[np.bool_]:
    perm = np.nan_to_num(a.master_perm, nan=0.0).astype(np.int64)
    out: npt.NDArray[np.bool_] = a.scraped & (((perm & 1) == 1) | ((a.slave_perm.astype(np.int64) & 1) == 1))
    return out


def _lag(total: int, queue: int) -> FloatArray:
    return np.asarray((np.arange(total, dtype=np.int64) * 7 + queue * 3) % 50, dtype=np.float64)


def render_topics(p: Plan, arrays: dict[int, GroupArrays], rng: np.random.Generator) -> list[Series]:
    """The topic series: ``understudy_topic_queue_info`` from one cluster controller (every
    bucket from the topic's creation on), and the consumer lag of each queue from the broker
    holding READ for its group (only while one does, and the group is scraped)."""
    total = p.spec.days * p.spec.buckets_per_day
    step_ms = p.spec.step_s * 1000
    out: list[Series] = []
    off = int(rng.integers(0, int(step_ms * 0.7)))
    for t in topic_plans(p.spec):
        for q, g in enumerate(t.queues):
            idx = np.arange(t.first, total, dtype=np.int64)
            labels = {"__name__": names.TOPIC_QUEUE_INFO, "group": group_name(g), "instance": "ctl-topics:9300",
                      "job": "understudy-controller", "queue": str(q), "topic": t.name}
            out.append(Series(labels, idx, np.ones(idx.size), np.zeros(0, dtype=np.int64), off))
            read = idx[_readable(arrays[g])[idx]]
            lag_labels = {"__name__": names.CONSUMER_LAG_MESSAGES, "consumer_group": t.consumer_group,
                          "group": group_name(g), "instance": f"lag-{g}:9400", "job": "understudy-broker",
                          "queue": str(q), "topic": t.name}
            out.append(Series(lag_labels, read, _lag(total, q)[read], np.zeros(0, dtype=np.int64), off))
    return out


def topic_truth(p: Plan, arrays: dict[int, GroupArrays]) -> list[dict[str, Any]]:
    """Per topic and UTC day, in seconds: ``known_s, unknown_s, write_available_s,
    read_full_s, read_partial_s, read_none_s`` (a bucket counts whole: the samples' view),
    and the consumer lag of its consumer group summed over the queues per bucket (buckets
    with any lag sample) as ``lag_p50, lag_p99, lag_max`` per day."""
    spec = p.spec
    total = spec.days * spec.buckets_per_day
    bpd = spec.buckets_per_day
    out: list[dict[str, Any]] = []
    for t in topic_plans(spec):
        groups = [arrays[g] for g in t.queues]
        alive = np.arange(total) >= t.first
        known = alive & np.logical_and.reduce([a.scraped for a in groups])
        writable = known & np.logical_or.reduce([_writable(a) for a in groups])
        readable = np.sum([_readable(a) for a in groups], axis=0)
        lag = np.sum([np.where(_readable(a), _lag(total, q), 0.0) for q, a in enumerate(groups)], axis=0)
        has_lag = np.logical_or.reduce([_readable(a) for a in groups]) & alive
        for day in range(spec.days):
            sl = slice(day * bpd, (day + 1) * bpd)
            k = known[sl]
            day_lag = lag[sl][has_lag[sl]]
            out.append({
                "topic": t.name,
                "day": _iso(spec, day * bpd)[:10],
                "known_s": int(k.sum()) * spec.step_s,
                "unknown_s": int((alive[sl] & ~k).sum()) * spec.step_s,
                "write_available_s": int(writable[sl].sum()) * spec.step_s,
                "read_full_s": int((k & (readable[sl] == len(groups))).sum()) * spec.step_s,
                "read_partial_s": int((k & (readable[sl] > 0) & (readable[sl] < len(groups))).sum()) * spec.step_s,
                "read_none_s": int((k & (readable[sl] == 0)).sum()) * spec.step_s,
                "consumer_group": t.consumer_group,
                "lag_buckets": int(day_lag.size),
                "lag_p50": float(np.percentile(day_lag, 50)) if day_lag.size else None,
                "lag_p99": float(np.percentile(day_lag, 99)) if day_lag.size else None,
                "lag_max": float(day_lag.max()) if day_lag.size else None,
            })
    return out


# ------------------------------------------------------------------------- event times

TOPIC_METRICS = (names.TOPIC_QUEUE_INFO, names.CONSUMER_LAG_MESSAGES)
EVENT_METRICS = (names.GROUP_MODE_ENTERED, names.BROKER_EXITED, names.BROKER_STARTED,
                 names.BROKER_READ_GAINED, names.BROKER_READ_LOST)
MODE_NAMES = ("NORMAL", "FENCING", "SLAVE_CONSUME", "RECOVERING")
DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class IncidentTimes:
    """One incident's instants, in milliseconds since the epoch (``event_times``). Each
    lies shortly before the bucket the plan puts the change in (see the module docstring)."""

    exited: int  # the master's process exits; the controller sees it (its READ ends)
    fencing: int
    slave_consume: int
    slave_read: int  # the acting slave gains READ: reads restored
    restarted: int  # the master's new process writes its first permission line
    violation_read: int | None  # it reads at once (two readers) ...
    violation_lost: int | None  # ... until here
    recovering: int
    slave_lost: int  # the acting slave drops READ: the failback gap begins
    master_read: int  # the master gains READ: the gap ends
    normal: int  # NORMAL written: healthy again


def incident_times(spec: SynthSpec, i: Incident) -> IncidentTimes:
    """The instants of incident ``i`` (pure: seeded by the spec's seed and the incident)."""
    rng = np.random.default_rng([spec.seed, 0xE7, i.group, i.b0])
    step_ms = spec.step_s * 1000

    def before(bucket: int) -> int:
        # after the previous bucket's scrapes (< 0.9 step into it), before this one starts;
        # at least 50 ms early, so the few ms added below stay inside the previous bucket
        early = int(rng.integers(50, max(51, int(step_ms * 0.09))))
        return spec.start_ms + bucket * step_ms - early

    t0, t1, t2, t3, t4 = before(i.b0), before(i.b1), before(i.b2), before(i.b3), before(i.b4)
    violation_lost = before(i.b2 + i.violation) if i.violation else None
    return IncidentTimes(
        exited=t0, fencing=t0 + 4, slave_consume=t1, slave_read=t1 + 2, restarted=t2,
        violation_read=t2 + 3 if i.violation else None, violation_lost=violation_lost,
        recovering=t3, slave_lost=t3 + 1, master_read=t4, normal=t4 + 1,
    )


# (bucket from which the change is visible, instant in ms)
Timed = list[tuple[int, int]]


@dataclass(slots=True)
class GroupEvents:
    """A group's event-time gauges, from the plan: the broker events per (ordinal, process
    generation, metric), the controller's per mode and the exits it saw."""

    spec: SynthSpec
    group: int
    broker: dict[tuple[int, int, str], Timed] = field(default_factory=dict)
    modes: dict[str, Timed] = field(default_factory=dict)
    exits: Timed = field(default_factory=list)

    def add(self, key: tuple[int, int, str], bucket: int, t_ms: int) -> None:
        self.broker.setdefault(key, []).append((bucket, t_ms))

    def _series(self, name: str, labels: dict[str, str], timed: Timed, idx: IntArray, off: int) -> list[Series]:
        total = self.spec.days * self.spec.buckets_per_day
        if not timed or not idx.size:
            return []
        timed = sorted(timed)
        starts = np.array([b for b, _ in timed], dtype=np.int64)
        instants = np.array([t for _, t in timed], dtype=np.int64)
        pos = np.searchsorted(starts, idx, side="right") - 1
        present = idx[pos >= 0]
        if not present.size:
            return []
        values = instants[pos[pos >= 0]] / 1000.0
        ends = present[np.flatnonzero(np.diff(present) > 1)] + 1
        if present[-1] + 1 < total:
            ends = np.append(ends, present[-1] + 1)
        return [Series({"__name__": name, **labels}, present, values, ends.astype(np.int64), off, timestamps=True)]

    def broker_series(self, labels: dict[str, str], ordinal: int, gen: int, *, idx: IntArray, off: int) -> list[Series]:
        """The gauges one broker process exports (``idx``: the buckets it is up and scraped)."""
        out: list[Series] = []
        for metric in (names.BROKER_STARTED, names.BROKER_READ_GAINED, names.BROKER_READ_LOST):
            out += self._series(metric, labels, self.broker.get((ordinal, gen, metric), []), idx, off)
        return out

    def controller_series(self, labels: dict[str, str], gen: int, *, first: int, idx: IntArray, mode: IntArray,
                          off: int) -> list[Series]:
        """The gauges controller process ``gen`` (running from bucket ``first``) exports: the
        first one knows every change; a later one what it wrote, and the mode it found,
        dated by the state's ``since``."""
        out: list[Series] = []
        for code, mode_name in enumerate(MODE_NAMES):
            timed = self.modes.get(mode_name, [])
            if gen:
                seen = [e for e in timed if e[0] <= first]
                timed = [e for e in timed if e[0] > first] + (seen[-1:] if int(mode[first]) == code else [])
            out += self._series(names.GROUP_MODE_ENTERED, {**labels, "mode": mode_name}, timed, idx, off)
        master = f"{group_name(self.group)}-0"
        exits = [e for e in self.exits if not gen or e[0] > first]
        out += self._series(names.BROKER_EXITED, {**labels, "broker": master, "role": "master"}, exits, idx, off)
        return out


def group_events(p: Plan, group: int) -> GroupEvents:
    """Every event-time change of ``group`` from the plan. Before the period: the brokers
    started and the master gained READ a day earlier, and the group was NORMAL since."""
    spec = p.spec
    ev = GroupEvents(spec=spec, group=group)
    base = spec.start_ms - DAY_MS
    ev.modes["NORMAL"] = [(0, base + 50)]
    ev.add((0, 0, names.BROKER_STARTED), 0, base + 100)
    ev.add((0, 0, names.BROKER_READ_GAINED), 0, base + 300)
    for s in range(1, spec.slaves + 1):
        ev.add((s, 0, names.BROKER_STARTED), 0, base + 200)
    mine = sorted((x for x in p.incidents if x.group == group), key=lambda x: x.b0)
    for gen, i in enumerate(mine, start=1):  # the master's process generation after it
        t = incident_times(spec, i)
        ev.exits.append((i.b0, t.exited))
        for bucket, mode_name, at in ((i.b0, "FENCING", t.fencing), (i.b1, "SLAVE_CONSUME", t.slave_consume),
                                      (i.b3, "RECOVERING", t.recovering), (i.b4, "NORMAL", t.normal)):
            ev.modes.setdefault(mode_name, []).append((bucket, at))
        ev.add((1, 0, names.BROKER_READ_GAINED), i.b1, t.slave_read)
        ev.add((1, 0, names.BROKER_READ_LOST), i.b3, t.slave_lost)
        ev.add((0, gen, names.BROKER_STARTED), i.b2, t.restarted)
        if t.violation_read is not None and t.violation_lost is not None:
            ev.add((0, gen, names.BROKER_READ_GAINED), i.b2, t.violation_read)
            ev.add((0, gen, names.BROKER_READ_LOST), i.b2 + i.violation, t.violation_lost)
        ev.add((0, gen, names.BROKER_READ_GAINED), i.b4, t.master_read)
    return ev


def _ms_iso(t_ms: int) -> str:
    return dt.datetime.fromtimestamp(t_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def exact_truth(spec: SynthSpec, i: Incident) -> dict[str, Any]:
    """Incident ``i`` as the job must report it from the event times, to the millisecond."""
    t = incident_times(spec, i)
    gap = t.master_read - t.slave_lost
    violation = 0 if t.violation_read is None or t.violation_lost is None else t.violation_lost - t.violation_read
    return {
        "master_lost_at": _ms_iso(t.exited),
        "reads_restored_at": _ms_iso(t.slave_read),
        "master_back_at": _ms_iso(t.restarted),
        "normal_at": _ms_iso(t.normal),
        "read_unavailable_s": (t.slave_read - t.exited + gap) / 1000,
        "failback_gap_s": gap / 1000,
        "one_reader_violation_s": violation / 1000,
        "one_reader_unresolved_s": 0.0,
        "backsync_s": (t.normal - t.recovering) / 1000,
        "duration_s": (t.normal - t.exited) / 1000,
    }


def _ts_ms(spec: SynthSpec, s: Series, buckets: IntArray) -> IntArray:
    jitter = (buckets * 7919 + s.offset_ms) % max(1, spec.step_s * 200)  # < 0.2 step
    return np.asarray(spec.start_ms + buckets * spec.step_s * 1000 + s.offset_ms + jitter, dtype=np.int64)


def _label_text(labels: dict[str, str], *, with_name: bool) -> str:
    items = [(k, v) for k, v in labels.items() if with_name or k != "__name__"]
    return ", ".join(f'{k}="{v}"' for k, v in items)


def _values_text(values: FloatArray, *, timestamps: bool = False) -> npt.NDArray[np.str_]:
    if timestamps:
        return _seconds_text(np.round(values * 1000).astype(np.int64))
    return np.asarray(np.round(values).astype(np.int64).astype(str))


def _seconds_text(ts_ms: IntArray) -> npt.NDArray[np.str_]:
    if not ts_ms.size:
        return np.zeros(0, dtype="<U1")
    whole = (ts_ms // 1000).astype(str)
    frac = np.strings.zfill((ts_ms % 1000).astype(str), 3)
    return np.asarray(np.strings.add(np.strings.add(whole, "."), frac))


def _day_slice(s: Series, lo: int, hi: int) -> tuple[IntArray, FloatArray, IntArray]:
    a, b = np.searchsorted(s.buckets, [lo, hi])
    c, d = np.searchsorted(s.stale, [lo, hi])
    return s.buckets[a:b], s.values[a:b], s.stale[c:d]


def write_query_range(path: pathlib.Path, spec: SynthSpec, series: list[Series], lo: int, hi: int) -> int:
    """One ``query_range`` matrix document (staleness is invisible through the API)."""
    parts: list[str] = []
    n = 0
    for s in series:
        buckets, values, _stale = _day_slice(s, lo, hi)
        if not buckets.size:
            continue
        pairs = np.strings.add(
            np.strings.add(np.strings.add("[", _seconds_text(_ts_ms(spec, s, buckets))), ',"'),
            np.strings.add(_values_text(values, timestamps=s.timestamps), '"]'),
        )
        parts.append('{"metric":' + json.dumps(s.labels, separators=(",", ":")) + ',"values":[' + ",".join(pairs.tolist()) + "]}")
        n += int(buckets.size)
    with path.open("w", encoding="utf-8") as fh:
        fh.write('{"status":"success","data":{"resultType":"matrix","result":[\n')
        fh.write(",\n".join(parts))
        fh.write("\n]}}\n")
    return n


def _sample_lines(spec: SynthSpec, s: Series, lo: int, hi: int, *, dump: bool) -> tuple[npt.NDArray[np.str_], IntArray]:
    buckets, values, stale = _day_slice(s, lo, hi)
    all_b = np.concatenate([buckets, stale])
    texts = np.concatenate([_values_text(values, timestamps=s.timestamps), np.full(stale.size, "NaN")])
    ts = _ts_ms(spec, s, all_b)
    if dump:
        prefix = "{" + _label_text(s.labels, with_name=True) + "} "
        stamp = ts.astype(str)
    else:
        prefix = s.labels["__name__"] + "{" + _label_text(s.labels, with_name=False) + "} "
        stamp = _seconds_text(ts)
    lines = np.strings.add(np.strings.add(np.strings.add(prefix, texts), " "), stamp)
    return np.asarray(lines), ts


def write_text(path: pathlib.Path, spec: SynthSpec, series: list[Series], lo: int, hi: int, *, dump: bool, rng: np.random.Generator) -> tuple[int, int, int]:
    """A dump (series after series, as promtool prints) or an OpenMetrics file (scrape
    after scrape); some lines are repeated at the end: duplicates, out of order."""
    chunks: list[npt.NDArray[np.str_]] = []
    stamps: list[IntArray] = []
    stale_n = 0
    for s in series:
        lines, ts = _sample_lines(spec, s, lo, hi, dump=dump)
        if lines.size:
            chunks.append(lines)
            stamps.append(ts)
            stale_n += int(np.searchsorted(s.stale, hi) - np.searchsorted(s.stale, lo))
    if not chunks:
        path.write_text("# EOF\n" if not dump else "", encoding="utf-8")
        return 0, 0, 0
    lines = np.concatenate(chunks)
    if not dump:
        lines = lines[np.argsort(np.concatenate(stamps), kind="stable")]
    n_dup = int(lines.size * spec.duplicate_fraction)
    dups = lines[rng.choice(lines.size, size=n_dup, replace=False)] if n_dup else lines[:0]
    with path.open("w", encoding="utf-8") as fh:
        if not dump:
            for name, kind in ((names.GROUP_MODE, "gauge"),
                               (names.counter_base(names.FAILOVER_TOTAL), "counter"),
                               (names.BROKER_PERMISSION, "gauge"), (names.UP, "gauge"),
                               *((m, "gauge") for m in (EVENT_METRICS if spec.event_times else ())),
                               *((m, "gauge") for m in (TOPIC_METRICS if spec.topics else ()))):
                fh.write(f"# TYPE {name} {kind}\n")
        fh.write("\n".join(lines.tolist()))
        fh.write("\n")
        if dups.size:
            fh.write("\n".join(dups.tolist()))
            fh.write("\n")
        if not dump:
            fh.write("# EOF\n")
    return int(lines.size), n_dup, stale_n


def _iso(spec: SynthSpec, bucket: int) -> str:
    ms = spec.start_ms + bucket * spec.step_s * 1000
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ground_truth(p: Plan) -> dict[str, Any]:
    """The injected events in the job's own terms (times are bucket starts, UTC)."""
    spec = p.spec
    step = spec.step_s
    incidents = [
        {
            "group": group_name(i.group),
            "master_lost_at": _iso(spec, i.b0),
            "reads_restored_at": _iso(spec, i.b1),
            "master_back_at": _iso(spec, i.b2),
            "normal_at": _iso(spec, i.b4),
            "read_unavailable_s": ((i.b1 - i.b0) + (i.b4 - i.b3)) * step,
            "failback_gap_s": (i.b4 - i.b3) * step,
            # transforms.group_states: two readers in one bucket alone are unresolved
            "one_reader_violation_s": (i.violation if i.violation >= 2 else 0) * step,
            "one_reader_unresolved_s": (1 if i.violation == 1 else 0) * step,
            "backsync_s": (i.b4 - i.b3) * step,
            **({"exact": exact_truth(spec, i)} if spec.event_times else {}),
        }
        for i in sorted(p.incidents, key=lambda x: (x.group, x.b0))
    ]
    failovers: dict[str, int] = {}
    for i in p.incidents:
        failovers[group_name(i.group)] = failovers.get(group_name(i.group), 0) + 1
    spec_doc = asdict(spec)
    if not spec.event_times:  # the output of a spec without the flag stays as it was
        del spec_doc["event_times"]
    if not spec.topics:  # likewise without topics
        del spec_doc["topics"], spec_doc["queues_per_group"]
    return {
        "spec": spec_doc,
        "start": _iso(spec, 0),
        "end": _iso(spec, spec.days * spec.buckets_per_day),
        "groups": [group_name(g) for g in range(spec.groups)],
        "incidents": incidents,
        "gaps": [
            {"group": group_name(g.group), "start": _iso(spec, g.start), "end": _iso(spec, g.end),
             "unknown_s": (g.end - g.start) * step}
            for g in sorted(p.gaps, key=lambda x: (x.group, x.start))
        ],
        "controller_restarts": [
            {"group": group_name(g), "at": _iso(spec, b)} for g, b in sorted(p.resets)
        ],
        "pod_restarts": [
            {"group": group_name(i.group), "broker": f"{group_name(i.group)}-0", "at": _iso(spec, i.b2)}
            for i in sorted(p.incidents, key=lambda x: (x.group, x.b0))
        ],
        "failovers_per_group": failovers,
    }


@dataclass(slots=True)
class SynthResult:
    """What was written."""

    files: list[pathlib.Path] = field(default_factory=list)
    samples: dict[str, int] = field(default_factory=dict)
    samples_per_day: dict[str, list[int]] = field(default_factory=dict)
    duplicates: int = 0
    staleness_markers: int = 0


def synthesize(
    spec: SynthSpec,
    *,
    out: pathlib.Path,
    formats: tuple[str, ...] = FORMATS,
    on_day: Any = None,
) -> SynthResult:
    """Write ``out/<format>/<YYYY-MM-DD>.<ext>`` for each format and day, and
    ``out/ground_truth.json``. ``on_day(day_index)`` is called after each day (progress)."""
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown format(s) {sorted(unknown)}: choose from {', '.join(FORMATS)}")
    p = plan(spec)
    rng = np.random.default_rng(spec.seed + 1)
    series = [s for g in range(spec.groups) for s in render_group(p, g, rng)]
    arrays = {g: group_arrays(p, g) for g in range(spec.groups)} if spec.topics else {}
    if spec.topics:
        series += render_topics(p, arrays, rng)
    result = SynthResult(samples=dict.fromkeys(formats, 0), samples_per_day={f: [] for f in formats})
    ext = {"query_range": "json", "dump": "txt", "openmetrics": "om"}
    for form in formats:
        (out / form).mkdir(parents=True, exist_ok=True)
    bpd = spec.buckets_per_day
    for day in range(spec.days):
        lo, hi = day * bpd, (day + 1) * bpd
        stamp = _iso(spec, lo)[:10]
        for form in formats:
            path = out / form / f"{stamp}.{ext[form]}"
            if form == "query_range":
                n = write_query_range(path, spec, series, lo, hi)
            else:
                n, dup, stale = write_text(path, spec, series, lo, hi, dump=form == "dump", rng=rng)
                result.duplicates += dup
                result.staleness_markers += stale
            result.samples[form] += n
            result.samples_per_day[form].append(n)
            result.files.append(path)
        if on_day is not None:
            on_day(day)
    truth = ground_truth(p)
    if spec.topics:
        truth["topics"] = topic_truth(p, arrays)
    truth["samples"] = result.samples
    truth["duplicates"] = result.duplicates
    truth["staleness_markers"] = result.staleness_markers
    (out / "ground_truth.json").write_text(json.dumps(truth, indent=2) + "\n", encoding="utf-8")
    return result
