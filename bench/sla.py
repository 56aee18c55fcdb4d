"""Benchmark: the SLA incident computation in Spark vs the same computation in DuckDB SQL.

Synthesises Prometheus exports (default: 200 groups at 15 s for 1, 2 and 4 weeks, in
query_range JSON and promtool dump text), then times, over the same files:
- Spark: read + parse + per-group states + incidents (understudy_spark, local[*]);
- DuckDB: the same incident definition as one SQL query (single-node reference).
Prints samples/s and the Spark/DuckDB ratio per size and form, checks both found the
same number of incidents with the same summed durations, prints how time grew against
data (linearity) and a Markdown table with the load average, and writes
``bench-results/sla.json`` (per size and form: ``spark_seconds``, ``duckdb_seconds``,
``samples``, ``ratio_spark_vs_duckdb`` and more; ``linearity``; ``load_avg_before``,
``target_ratio`` (1.5) and ``ratio_within_target``). No assertions. The largest size
is synthesised once; smaller sizes are its first days (hard links). Spark is warmed up on
one day, runs every size, and exits; then DuckDB runs every size.

    python bench/sla.py                        # what `make bench` runs
    python bench/sla.py --groups 20 --weeks 1  # a quick look
    python bench/sla.py --month                # add the 30-day size

A 200-group week is ~48M samples per form (~1 GB of dump text a day, ~28 GB for four
weeks; the bench checks the free disk first). On 2 cores the default sizes took 70-80 minutes
(16 to synthesise, 54-64 to run; --reuse skips the first); --groups/--weeks shrink it (say so
next to the figures, docs/sla.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any

STEP_S = 15
PERM = "understudy_broker_permission"
MODE = "understudy_group_mode"


def say(message: str) -> None:
    print(f"[bench sla {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# One incident definition, the one in transforms.incidents (DESIGN "SLA definitions").
INCIDENTS_SQL = """
WITH clean AS (
  SELECT grp, broker, role, metric, floor(ts_ms / {step_ms})::BIGINT AS bucket,
         arg_max(value, ts_ms) AS value
  FROM samples
  WHERE metric IN ('{mode}', '{perm}') AND grp IS NOT NULL AND grp <> ''
    AND value IS NOT NULL AND NOT isnan(value)
  GROUP BY ALL
), states AS (
  SELECT grp, bucket,
         max(CASE WHEN metric = '{mode}' THEN value END)::INT AS mode,
         max(CASE WHEN metric = '{perm}' AND role = 'master' THEN (value::INT & 1) END) AS master_read,
         coalesce(sum(CASE WHEN metric = '{perm}' THEN (value::INT & 1) END), 0) AS readers,
         count(CASE WHEN metric = '{perm}' THEN 1 END) AS perm_series
  FROM clean GROUP BY ALL
), s1 AS (
  SELECT *, (mode IS NOT NULL OR (perm_series >= max(perm_series) OVER g AND max(perm_series) OVER g > 0)) AS known,
         readers >= 1 AS readable,
         max((mode IS NOT NULL)::INT) OVER g = 1 AS has_mode,
         readers >= 2 AND coalesce((lag(bucket) OVER o = bucket - 1 AND lag(readers) OVER o >= 2)
                                   OR (lead(bucket) OVER o = bucket + 1 AND lead(readers) OVER o >= 2), false) AS violation
  FROM states WINDOW g AS (PARTITION BY grp), o AS (PARTITION BY grp ORDER BY bucket)
), s2 AS (
  SELECT *,
    CASE WHEN (CASE WHEN has_mode THEN mode IS NOT NULL AND mode <> 0 AND coalesce(master_read, 0) = 0
                    ELSE known AND NOT readable AND coalesce(max(readable::INT) OVER before, 0) = 1 END) THEN 1
         WHEN master_read = 1 AND (NOT has_mode OR mode = 0) THEN 0 END AS event
  FROM s1 WINDOW before AS (PARTITION BY grp ORDER BY bucket ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
), s3 AS (
  SELECT *, coalesce(last_value(event IGNORE NULLS) OVER run, 0) AS in_inc
  FROM s2 WINDOW run AS (PARTITION BY grp ORDER BY bucket ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
), s4 AS (
  SELECT *, coalesce(lag(in_inc) OVER (PARTITION BY grp ORDER BY bucket), 0) AS prev_in FROM s3
), s5 AS (
  SELECT *, last_value(CASE WHEN in_inc = 1 AND prev_in = 0 THEN bucket END IGNORE NULLS) OVER run AS start
  FROM s4 WINDOW run AS (PARTITION BY grp ORDER BY bucket ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
), s6 AS (
  SELECT *, max((in_inc = 1 AND readable)::INT) OVER (PARTITION BY grp, start ORDER BY bucket
             ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) = 1 AS restored
  FROM s5 WHERE in_inc = 1 OR prev_in = 1
)
SELECT grp AS "group", start AS master_lost_b,
       min(CASE WHEN in_inc = 1 AND readable THEN bucket END) AS reads_restored_b,
       min(CASE WHEN in_inc = 1 AND restored AND master_read IS NOT NULL THEN bucket END) AS master_back_b,
       min(CASE WHEN in_inc = 0 THEN bucket END) AS normal_b,
       count(CASE WHEN in_inc = 1 AND known AND NOT readable THEN 1 END) * {step_s} AS read_unavailable_s,
       count(CASE WHEN in_inc = 1 AND known AND NOT readable AND restored THEN 1 END) * {step_s} AS failback_gap_s,
       count(CASE WHEN in_inc = 1 AND violation THEN 1 END) * {step_s} AS one_reader_violation_s,
       count(CASE WHEN in_inc = 1 AND readers >= 2 AND NOT violation THEN 1 END) * {step_s} AS one_reader_unresolved_s
FROM s6 GROUP BY ALL
"""

DUMP_SAMPLES = r"""
CREATE OR REPLACE TEMP VIEW samples AS
SELECT regexp_extract(line, '__name__="([^"]*)"', 1) AS metric,
       regexp_extract(line, '[{{ ,]group="([^"]*)"', 1) AS grp,
       regexp_extract(line, '[{{ ,]broker="([^"]*)"', 1) AS broker,
       regexp_extract(line, '[{{ ,]role="([^"]*)"', 1) AS role,
       TRY_CAST(parts[-2] AS DOUBLE) AS value,
       TRY_CAST(parts[-1] AS BIGINT) AS ts_ms
FROM (SELECT line, string_split(line, ' ') AS parts
      FROM read_csv('{glob}', columns = {{'line': 'VARCHAR'}}, sep = '\x01', quote = '', escape = '',
                    header = false, auto_detect = false))
"""

QUERY_RANGE_SAMPLES = """
CREATE OR REPLACE TEMP VIEW samples AS
SELECT s.metric['__name__'] AS metric, s.metric['group'] AS grp, s.metric['broker'] AS broker,
       s.metric['role'] AS role,
       TRY_CAST(json_extract_string(v, '$[1]') AS DOUBLE) AS value,
       round(TRY_CAST(json_extract_string(v, '$[0]') AS DOUBLE) * 1000)::BIGINT AS ts_ms
FROM (SELECT unnest(data.result) AS s
      FROM read_json('{glob}', format = 'auto', maximum_object_size = 536870912,
                     columns = {{'status': 'VARCHAR',
                                 'data': 'STRUCT(resultType VARCHAR, result STRUCT(metric MAP(VARCHAR, VARCHAR), "values" JSON[])[])'}})),
     unnest(s."values") AS t(v)
"""


# DuckDB runs after Spark's JVM has exited, so by default it has DuckDB's own default
# limit (80 % of RAM); set this to cap it lower.
DUCKDB_MEMORY = os.environ.get("UNDERSTUDY_BENCH_DUCKDB_MEMORY", "")


def run_duckdb(form: str, folder: pathlib.Path) -> tuple[float, list[dict[str, Any]]]:
    """The reference over ``folder/<form>/``: (seconds, incident rows as dicts; times as
    bucket numbers ``*_b``, durations in seconds as in incidents.csv)."""
    import duckdb

    ext = {"query_range": "json", "dump": "txt"}[form]
    glob = str(folder / form / f"*.{ext}")
    con = duckdb.connect()
    # Let it spill: an in-memory database does not by default, and four weeks of 200
    # groups of query_range did not fit in 9 GB.
    spill = folder.parent / "duckdb.tmp"
    if DUCKDB_MEMORY:
        con.execute(f"SET memory_limit = '{DUCKDB_MEMORY}'")
    con.execute(f"SET temp_directory = '{spill}'")
    con.execute("SET preserve_insertion_order = false")
    try:
        t0 = time.monotonic()
        con.execute((DUMP_SAMPLES if form == "dump" else QUERY_RANGE_SAMPLES).format(glob=glob))
        cur = con.execute(INCIDENTS_SQL.format(step_ms=STEP_S * 1000, step_s=STEP_S, mode=MODE, perm=PERM))
        rows = cur.fetchall()
        seconds = time.monotonic() - t0
        names = [d[0] for d in cur.description]
        return seconds, [dict(zip(names, row, strict=True)) for row in rows]
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def run_spark(spark: Any, form: str, folder: pathlib.Path) -> tuple[float, list[dict[str, Any]], int]:
    """The job's own path up to the incidents (``job.observed_states``, then
    ``transforms.incidents``): (seconds, incident rows as dicts, samples accepted)."""
    from understudy_spark import job, readers, transforms

    t0 = time.monotonic()
    files = readers.list_inputs(spark, [str(folder / form)])
    states, seen = job.observed_states(spark, files, step_s=STEP_S)
    rows = [r.asDict() for r in transforms.incidents(states, step_s=STEP_S).collect()]
    return time.monotonic() - t0, rows, int(seen.get["samples"])


# Summed over all incidents, Spark's and DuckDB's must be equal (the same definition).
TOTALS = ("read_unavailable_s", "failback_gap_s", "one_reader_violation_s", "one_reader_unresolved_s")


def totals(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {key: float(sum(r[key] for r in rows)) for key in TOTALS}


# synth renders a whole plan in memory before writing it (~0.85 GB per 200-group day):
# the exports are written as weekly plans, each with its own seed, one after the other.
CHUNK_DAYS = 7


def stop_spark(spark: Any) -> None:
    """Stop the session and its JVM, so its heap is free for DuckDB. (``spark.stop()``
    alone leaves the py4j gateway JVM running; it exits when its stdin closes.)"""
    from pyspark import SparkContext

    with contextlib.suppress(Exception):  # a JVM that died of OOM cannot be stopped
        spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is not None:
        with contextlib.suppress(Exception):
            gateway.shutdown()
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None


def synthesize_weeks(
    synthesize: Any, spec_type: Any, *, groups: int, days: int, forms: tuple[str, ...],
    out: pathlib.Path, incidents_per_group_week: float,
) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """``days`` of exports into ``out/<form>/`` as consecutive weekly syntheses; returns
    the samples per day and form, and the merged ground truth (its ``incidents``)."""
    import datetime as dt

    start = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    per_day: dict[str, list[int]] = {f: [] for f in forms}
    incidents: list[dict[str, Any]] = []
    for chunk, first in enumerate(range(0, days, CHUNK_DAYS)):
        n = min(CHUNK_DAYS, days - first)
        spec = spec_type(
            groups=groups, days=n, step_s=STEP_S, seed=42 + chunk,
            incidents=int(groups * n / 7 * incidents_per_group_week),
            start=(start + dt.timedelta(days=first)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        written = synthesize(spec, out=out, formats=forms,
                             on_day=lambda d, first=first: say(f"  day {first + d + 1}/{days} written"))
        for form in forms:
            per_day[form] += written.samples_per_day[form]
        incidents += json.loads((out / "ground_truth.json").read_text())["incidents"]
    truth = {"start": start.strftime("%Y-%m-%dT%H:%M:%SZ"), "groups_total": groups, "incidents": incidents}
    (out / "ground_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return per_day, truth


def link_prefix(data: pathlib.Path, folder: pathlib.Path, forms: tuple[str, ...], days: int) -> None:
    """``folder/<form>/`` = hard links to the first ``days`` day files of ``data/<form>/``
    (one synthesis serves every size; the files are the same bytes)."""
    shutil.rmtree(folder, ignore_errors=True)
    for form in forms:
        (folder / form).mkdir(parents=True)
        for path in sorted((data / form).iterdir())[:days]:
            os.link(path, folder / form / path.name)


def injected_before(truth: dict[str, Any], days: int) -> int:
    """Injected incidents that start in the first ``days`` days."""
    import datetime as dt

    start = dt.datetime.fromisoformat(truth["start"].replace("Z", "+00:00"))
    cutoff = start + dt.timedelta(days=days)
    return sum(
        1 for i in truth["incidents"]
        if dt.datetime.fromisoformat(i["master_lost_at"].replace("Z", "+00:00")) < cutoff
    )


def linearity(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per engine and form: seconds per million samples at each size, and how each size's
    time grew against its data (1.0 = exactly linear)."""
    out: list[dict[str, Any]] = []
    for form in sorted({r["form"] for r in results}):
        rows = sorted((r for r in results if r["form"] == form), key=lambda r: r["samples"])
        for engine in ("spark", "duckdb"):
            base = rows[0]
            out.append({
                "form": form, "engine": engine,
                "seconds_per_million_samples": {
                    r["size"]: round(r[f"{engine}_seconds"] / r["samples"] * 1e6, 3) for r in rows
                },
                "growth_vs_data": {
                    r["size"]: round((r[f"{engine}_seconds"] / base[f"{engine}_seconds"])
                                     / (r["samples"] / base["samples"]), 2)
                    for r in rows[1:]
                },
            })
    return out


def duckdb_version() -> str:
    """The DuckDB the reference ran on: versions differ a lot on these JSON files (2.0.1 read
    a 200-group day of query_range in 89 s, 1.5.6 in 6.6 s), so the figures name it."""
    import duckdb

    return str(duckdb.__version__)


# The target: Spark within 1.5x DuckDB's time, for both forms, at every size.
TARGET_RATIO = 1.5


def table(results: list[dict[str, Any]], *, load_before: list[float], target: float) -> str:
    """The figures as a Markdown table (what docs/sla.md quotes), with the load average."""
    lines = [
        f"load average before the run: {' / '.join(f'{x:.2f}' for x in load_before)} (1/5/15 min)",
        "",
        "| size | form | samples | Spark | DuckDB | Spark/DuckDB | incidents Spark/DuckDB/injected | totals | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = r["ratio_spark_vs_duckdb"]
        lines.append(
            f"| {r['size']} | {r['form']} | {r['samples'] / 1e6:.1f}M | {r['spark_seconds']:.1f} s "
            f"({r['spark_samples_per_s'] / 1e3:.0f}k/s) | {r['duckdb_seconds']:.1f} s "
            f"({r['duckdb_samples_per_s'] / 1e3:.0f}k/s) | **{ratio:.2f}**{'' if ratio <= target else ' (over ' + str(target) + ')'} "
            f"| {r['incidents_spark']}/{r['incidents_duckdb']}/{r['incidents_injected']} "
            f"| {'agree' if r['totals_agree'] else 'DIFFER'} | {r['load_avg_1m']} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=200)
    ap.add_argument("--weeks", default="1,2,4", help="comma-separated sizes in weeks")
    ap.add_argument("--month", action="store_true", help="also the 30-day size")
    ap.add_argument("--forms", default="query_range,dump")
    ap.add_argument("--incidents-per-group-week", type=float, default=2.0)
    ap.add_argument("--workdir", default=".understudy/bench-sla")
    ap.add_argument("--out", default="bench-results/sla.json")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic exports")
    ap.add_argument("--reuse", action="store_true",
                    help="use the exports a kept or interrupted run left in --workdir (same groups, enough days)")
    args = ap.parse_args(argv)

    sys.path[:0] = [str(pathlib.Path(__file__).resolve().parents[1] / "spark_jobs" / "src")]
    from understudy_spark import job
    from understudy_spark.synth import SynthSpec, synthesize

    try:
        sizes = sorted({(f"{int(w)}w", int(w) * 7) for w in args.weeks.split(",") if w.strip()}, key=lambda s: s[1])
    except ValueError:
        ap.error(f"--weeks must be whole numbers separated by commas, got {args.weeks!r}")
    if args.month:
        sizes.append(("30d", 30))
    if not sizes or args.groups < 1:
        ap.error("need at least one size and one group")
    forms = tuple(f.strip() for f in args.forms.split(",") if f.strip())
    if unknown := set(forms) - {"query_range", "dump"}:
        ap.error(f"--forms: unknown {sorted(unknown)}; choose from query_range, dump")
    work = pathlib.Path(args.workdir)
    max_days = max(days for _, days in sizes)
    # ~6 series per group at one sample per step; dump text ~145 bytes a sample,
    # query_range ~21: refuse early rather than fill the disk half-way.
    per_sample = {"dump": 145, "query_range": 21}
    need = args.groups * 6 * 86400 // STEP_S * max_days * sum(per_sample[f] for f in forms)
    work.mkdir(parents=True, exist_ok=True)
    reusable = work / "data" / "ground_truth.json"
    if args.reuse and reusable.exists():
        # the sizes are hard links to the kept exports: no new space, only DuckDB's spill
        need = 0
    free = shutil.disk_usage(work).free
    say(f"{args.groups} groups x {max_days} days, {', '.join(forms)}: ~{need / 1e9:.1f} GB of exports "
        f"({free / 1e9:.1f} GB free in {work})")
    if need > free * 0.9:
        print(f"bench sla: not enough disk in {work}: need ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free; "
              "use --groups/--weeks or --workdir", file=sys.stderr)
        return 2
    # local[*]: the driver is the executor. A 200-group day of query_range is one JSON
    # document (~145 MB); the job reads it series by series in several tasks now, but the
    # heap stays what the earlier figures were measured with.
    os.environ.setdefault("UNDERSTUDY_SPARK_DRIVER_MEMORY", "12g")
    load_before = [round(x, 2) for x in os.getloadavg()]
    say(f"load average {load_before} (1/5/15 min): the machine may be shared, read the figures next to it")
    job.quiet_pandas_warning()
    results: list[dict[str, Any]] = []
    data = work / "data"
    truth_path = data / "ground_truth.json"
    kept = json.loads(truth_path.read_text()) if args.reuse and truth_path.exists() else None
    have = sorted((data / forms[0]).iterdir()) if kept is not None else []
    if kept is not None and kept.get("groups_total", len(kept.get("groups", []))) == args.groups and len(have) >= max_days:
        say(f"reusing the exports in {data} ({len(have)} days)")
        truth = kept
    else:
        if args.reuse:
            say(f"nothing reusable in {data} for {args.groups} groups x {max_days} days; synthesising")
        shutil.rmtree(data, ignore_errors=True)
        say(f"synthesising {args.groups} groups x {max_days} days once, a week at a time; "
            "smaller sizes are its first days")
        t0 = time.monotonic()
        _, truth = synthesize_weeks(
            synthesize, SynthSpec, groups=args.groups, days=max_days, forms=forms, out=data,
            incidents_per_group_week=args.incidents_per_group_week,
        )
        say(f"synthesised in {time.monotonic() - t0:.1f} s")
    finished = False
    say("starting Spark (local[*])")
    spark = job.build_session(shuffle_partitions=64, app="understudy-sla-bench")
    spark_runs: dict[tuple[str, str], tuple[float, list[dict[str, Any]], int]] = {}
    try:
        # The JVM compiles the hot paths during the first query; without a warm-up the
        # first size would carry that one-off cost and bend the linearity figures.
        warm = work / "warmup"
        link_prefix(data, warm, forms, 1)
        for form in forms:
            say(f"warm-up: Spark over one day of {form} (not timed)")
            run_spark(spark, form, warm)
        shutil.rmtree(warm, ignore_errors=True)
        # Every Spark run first, then the JVM exits and DuckDB has the machine's memory:
        # the two never hold memory at the same time (DuckDB needed more than 9 GB for
        # four weeks of query_range, next to Spark's 12 GB heap on a 23 GB machine).
        for label, days in sizes:
            link_prefix(data, work / label, forms, days)
            for form in forms:
                say(f"{label} {form}: Spark ...")
                spark_runs[label, form] = run_spark(spark, form, work / label)
                spark_s, spark_rows, samples = spark_runs[label, form]
                say(f"{label} {form}: Spark {spark_s:.1f} s ({samples / spark_s:.0f} samples/s), "
                    f"{len(spark_rows)} incidents")
        stop_spark(spark)
        for label, days in sizes:
            folder = work / label
            incidents = injected_before(truth, days)
            for form in forms:
                say(f"{label} {form}: DuckDB ...")
                spark_s, spark_rows, samples = spark_runs[label, form]
                spark_n = len(spark_rows)
                duck_s, duck_rows = run_duckdb(form, folder)
                duck_n = len(duck_rows)
                spark_totals, duck_totals = totals(spark_rows), totals(duck_rows)
                agree = spark_totals == duck_totals
                row = {
                    "size": label, "days": days, "groups": args.groups, "form": form,
                    "samples": samples, "spark_seconds": round(spark_s, 2), "duckdb_seconds": round(duck_s, 2),
                    "spark_samples_per_s": round(samples / spark_s), "duckdb_samples_per_s": round(samples / duck_s),
                    "ratio_spark_vs_duckdb": round(spark_s / duck_s, 2),
                    "incidents_injected": incidents, "incidents_spark": spark_n, "incidents_duckdb": duck_n,
                    "totals_spark": spark_totals, "totals_agree": agree,
                    # the machine may be shared: read every figure next to its load
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                }
                results.append(row)
                print(f"{label:>4} {form:<12} {samples:>11} samples  Spark {spark_s:8.1f} s "
                      f"({row['spark_samples_per_s']:>9}/s)  DuckDB {duck_s:8.1f} s  ratio {row['ratio_spark_vs_duckdb']:5.2f}  "
                      f"incidents {spark_n}/{duck_n}/{incidents} totals {'agree' if agree else 'DIFFER'}  "
                      f"load {row['load_avg_1m']}", flush=True)
                if not agree:
                    say(f"{label} {form}: totals differ: Spark {spark_totals}, DuckDB {duck_totals}")
            shutil.rmtree(folder, ignore_errors=True)
        finished = True
    finally:
        stop_spark(spark)
        if args.keep or not finished:
            say(f"exports kept in {data}; rerun with --reuse to skip synthesis")
        else:
            shutil.rmtree(data, ignore_errors=True)
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        growth = linearity(results) if len({r["size"] for r in results}) > 1 else []
        for g in growth:
            print(f"linearity {g['engine']:<6} {g['form']:<12} s per 1M samples {g['seconds_per_million_samples']}  "
                  f"time growth / data growth {g['growth_vs_data']}", flush=True)
        print(table(results, load_before=load_before, target=TARGET_RATIO), flush=True)
        print(f"DuckDB {duckdb_version()}", flush=True)
        out.write_text(json.dumps({"benchmark": "sla", "step_s": STEP_S, "cpus": os.cpu_count(),
                                   "results": results, "linearity": growth,
                                   "load_avg_before": load_before, "target_ratio": TARGET_RATIO,
                                   "duckdb_version": duckdb_version(),
                                   "ratio_within_target": all(r["ratio_spark_vs_duckdb"] <= TARGET_RATIO
                                                              for r in results) if results else None},
                                  indent=2) + "\n")
        say(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
