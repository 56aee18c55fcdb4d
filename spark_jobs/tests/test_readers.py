"""Readers: format detection, each export form, and bad input (error names file and
line; ``--skip-bad`` counts what it rejected)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import pathlib
from typing import Any

import pytest

from understudy_spark import job, readers
from understudy_spark.readers import ExportFormat, InputError, detect_format

T_MS = 1793534400000  # 2026-11-01T12:00:00Z
PERM = 'understudy_broker_permission{group="g", broker="g-0", role="master"}'
PERM_NAME = "understudy_broker_permission"


@pytest.mark.parametrize(
    ("head", "form"),
    [
        (b'{"status":"success","data":{}}', ExportFormat.QUERY_RANGE),
        (b'\n  {\n  "data": {}}', ExportFormat.QUERY_RANGE),
        (b'{__name__="up", job="x"} 1 1793534400000\n', ExportFormat.DUMP),
        (b"# HELP up x\n# TYPE up gauge\nup 1 1793534400\n", ExportFormat.EXPOSITION),
        (b'up{job="x"} 1 1793534400000\n', ExportFormat.EXPOSITION),
    ],
)
def test_format_is_detected_from_content(head: bytes, form: ExportFormat) -> None:
    assert detect_format(head, path="f") is form


@pytest.mark.parametrize("head", [b"", b"\n\n   \n", b"<html>oops</html>", b"\x00\x01binary", b"[1, 2]"])
def test_unknown_format_names_file_and_line(head: bytes) -> None:
    with pytest.raises(InputError, match=r"^x\.bin:\d+: (unknown format|empty file)"):
        detect_format(head, path="x.bin")


def _write(tmp: pathlib.Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.spark
def test_every_form_reads_to_the_same_samples(spark: Any, tmp_path: pathlib.Path) -> None:
    # ``note`` comes first and its value looks like the start of a group label: the keyed
    # path must skip it as a whole pair and still find the real (escaped) group.
    labels = {"note": "a, group=", "group": 'g"1', "broker": "g-0", "role": "master"}
    values = [3.0, 0.0, 1.0]
    stamps = [T_MS + i * 15000 for i in range(3)]
    qr = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "understudy_broker_permission", **labels},
         "values": [[t / 1000, str(int(v))] for t, v in zip(stamps, values, strict=True)]}]}}
    label_text = 'note="a, group=", group="g\\"1", broker="g-0", role="master"'
    dump = "".join(f'{{__name__="understudy_broker_permission", {label_text}}} {v:g} {t}\n'
                   for t, v in zip(stamps, values, strict=True))
    om = "# TYPE understudy_broker_permission gauge\n" + "".join(
        f"understudy_broker_permission{{{label_text}}} {v:g} {t / 1000:.3f}\n"
        for t, v in zip(stamps, values, strict=True)) + "# EOF\n"
    text_ms = "".join(f"understudy_broker_permission{{{label_text}}} {v:g} {t}\n"
                      for t, v in zip(stamps, values, strict=True))
    files = {
        "qr.json": json.dumps(qr, indent=1),
        "dump.txt": dump,
        "metrics.om": om,
        "metrics.prom": text_ms,
    }
    for name, text in files.items():
        _write(tmp_path, name, text)
    inputs = readers.list_inputs(spark, [str(tmp_path / "*")])
    assert sorted(f.form.value for f in inputs) == ["dump", "openmetrics", "openmetrics", "query_range"]
    rows = readers.read_parsed(spark, inputs).collect()
    assert [r.raw for r in rows if not r.ok] == []
    got = sorted((r.timestamp, r.metric, tuple(sorted(r.labels.items())), r.value) for r in rows)
    when = [dt.datetime.fromtimestamp(t / 1000, tz=dt.UTC).replace(tzinfo=None) for t in stamps]
    one = [(w, "understudy_broker_permission", tuple(sorted(labels.items())), v)
           for w, v in zip(when, values, strict=True)]
    assert got == sorted(one * 4)
    # The job's keyed path reads the same three labels straight from the text.
    keyed = readers.read_parsed(spark, inputs, keyed=True).collect()
    assert all(r.ok for r in keyed)
    assert sorted((r.timestamp, r.group, r.broker, r.role, r.value) for r in keyed) == sorted(
        [(w, 'g"1', "g-0", "master", v) for w, v in zip(when, values, strict=True)] * 4
    )


BAD_CASES = [
    # name, content, expected message pattern (after the path)
    ("broken.json", '{"status": "success",\n "data": {"resultType": "matrix",\n "result": [}\n}',
     r":3: malformed JSON"),
    ("failed.json", '{"status": "error", "errorType": "bad_data", "error": "parse error"}',
     r":1: query failed: status='error'"),
    ("vector.json", '{"status": "success", "data": {"resultType": "vector", "result": []}}',
     r":1: resultType 'vector' is not 'matrix'"),
    ("dump.txt", f'{{__name__="up", group="g"}} 1 {T_MS}\n{{__name__="up", group="g"}} one {T_MS}\n',
     r":2: malformed dump line"),
    ("metrics.om", f"# TYPE x gauge\n{PERM} 3 {T_MS}\n{PERM} 3\n# EOF\n",
     r":3: malformed exposition \(with timestamp\) line"),
]


@pytest.mark.spark
@pytest.mark.parametrize(("name", "content", "pattern"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input_error_names_file_and_line(spark: Any, tmp_path: pathlib.Path, name: str, content: str,
                                             pattern: str) -> None:
    path = _write(tmp_path, name, content)
    config = job.JobConfig(inputs=(path,), out=str(tmp_path / "out"))
    with pytest.raises(InputError, match=pattern) as err:
        job.run(spark, config, progress=lambda _m: None)
    assert name in str(err.value)
    assert "--skip-bad" in str(err.value)
    assert not (tmp_path / "out").exists()  # nothing written from bad input


@pytest.mark.spark
def test_unknown_format_and_missing_file_are_clear_errors(spark: Any, tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, "notes.txt", "\n\nthese are not metrics: 1 2 3\n")
    with pytest.raises(InputError, match=r"notes\.txt:3: unknown format"):
        readers.list_inputs(spark, [path])
    with pytest.raises(InputError, match=r"nothing-here\*: no such file"):
        readers.list_inputs(spark, [str(tmp_path / "nothing-here*")])


@pytest.mark.spark
def test_query_range_pairs_are_checked_one_by_one(spark: Any, tmp_path: pathlib.Path) -> None:
    # Pairs are read as their JSON text and cut with string functions: a pair with one or
    # three elements, or a value that is not a number, is one rejected sample; quoted
    # seconds and blanks are accepted.
    t = T_MS / 1000
    text = (
        '{"status":"success","data":{"resultType":"matrix","result":[{"metric":'
        '{"__name__":"up","group":"g","broker":"g-0"},"values":['
        f'[{t},"1"], [ {t + 15} , "0" ], ["{t + 30}","1"], [{t + 45}], [{t + 60},"1","2"], '
        f'[{t + 75},"one"], [{t + 90},"NaN"]]}}]}}}}'
    )
    files = readers.list_inputs(spark, [_write(tmp_path, "qr.json", text)])
    rows = readers.read_parsed(spark, files, keyed=True).collect()
    good = sorted((r.timestamp, r.value) for r in rows if r.ok and r.value == r.value)
    when = [dt.datetime.fromtimestamp(t + i * 15, tz=dt.UTC).replace(tzinfo=None) for i in range(3)]
    assert good == list(zip(when, [1.0, 0.0, 1.0], strict=True))
    assert sum(1 for r in rows if r.ok) == 4  # the three above and the NaN (a staleness marker)
    bad = sorted(r.raw for r in rows if not r.ok)
    assert len(bad) == 3
    assert all(r.startswith('up {"group":"g","broker":"g-0","role":""} [') for r in bad)


# Instants no timestamp holds (NaN, infinities, past the year 9999): each such sample is
# one rejected row; the job used to die on an overflowing cast instead.
IMPOSSIBLE_TIMES = [
    ("qr.json",
     '{"status":"success","data":{"resultType":"matrix","result":[{"metric":'
     '{"__name__":"up","group":"g","broker":"g-0"},"values":['
     f'[{T_MS / 1000},"1"],[NaN,"1"],[Infinity,"1"],[-Infinity,"1"],[1e300,"1"],["NaN","1"],'
     '[9.3e12,"1"]]}]}}', 6),
    ("dump.txt", "".join(f'{{__name__="up", group="g"}} 1 {t}\n' for t in (
        T_MS, 9223372036854775807, 9300000000000000, -9223372036854775808, 253402300800000)), 4),
    ("metrics.prom", "".join(f'up{{group="g"}} 1 {t}\n' for t in (
        T_MS, 99999999999999999999, 9300000000000000, "93000000000000000.5")), 3),
]


@pytest.mark.spark
@pytest.mark.parametrize(("name", "content", "rejected"), IMPOSSIBLE_TIMES, ids=[c[0] for c in IMPOSSIBLE_TIMES])
def test_a_sample_at_an_impossible_time_is_rejected_not_fatal(spark: Any, tmp_path: pathlib.Path, name: str,
                                                               content: str, rejected: int) -> None:
    path = _write(tmp_path, name, content)
    rows = readers.read_parsed(spark, readers.list_inputs(spark, [path]), keyed=True).collect()
    assert [(r.timestamp, r.value) for r in rows if r.ok] == [(dt.datetime(2026, 11, 1, 12), 1.0)]
    assert sum(r.weight for r in rows if not r.ok) == rejected
    config = job.JobConfig(inputs=(path,), out=str(tmp_path / "out"))
    with pytest.raises(InputError, match="--skip-bad") as err:  # a clear error, not a Spark failure
        job.run(spark, config, progress=lambda _m: None)
    assert name in str(err.value)
    expected = "between the years 1 and 9999" if name.endswith(".json") else ":2: malformed"
    assert expected in str(err.value)


@pytest.mark.spark
def test_a_dump_timestamp_is_digits_with_an_optional_minus(spark: Any, tmp_path: pathlib.Path) -> None:
    # The shape is checked without a regex (first and last byte, next to the cast), which
    # on its own would take a plus sign or a tab around the digits.
    stamps = [f"+{T_MS}", f"{T_MS}\t", f"\t{T_MS}", f"0{T_MS}", "-5", f"{T_MS}.0", f"{T_MS}x"]
    text = "".join(f'{{__name__="up", group="g"}} 1 {t}\n' for t in stamps)
    rows = readers.read_parsed(spark, readers.list_inputs(spark, [_write(tmp_path, "dump.txt", text)]),
                               keyed=True).collect()
    epoch = dt.datetime(1970, 1, 1)
    assert [r.ok for r in rows] == [False, False, False, True, True, False, False]
    assert [(r.timestamp - epoch) // dt.timedelta(milliseconds=1) for r in rows if r.ok] == [T_MS, -5]


@pytest.mark.spark
def test_seconds_are_rounded_to_the_nearest_millisecond_halves_away_from_zero(
        spark: Any, tmp_path: pathlib.Path) -> None:
    # The reader rounds seconds * 1000 without BigDecimal; the millisecond must be exactly
    # what rounding the double half away from zero gives, as Spark's round did.
    seconds = ["-0.0015", "-0.0025", "0.0005", "0.0004999", "0.0025", "-1.5",
               "1795211698.9605", "1795211698.9615", "1795211698.961", "1793534400.0005", "4.9e-324"]
    values = ",".join(f'[{s},"1"]' for s in seconds)
    text = ('{"status":"success","data":{"resultType":"matrix","result":[{"metric":'
            '{"__name__":"up","group":"g"},"values":[' + values + "]}]}}")
    rows = readers.read_parsed(spark, readers.list_inputs(spark, [_write(tmp_path, "qr.json", text)]),
                               keyed=True).collect()
    epoch = dt.datetime(1970, 1, 1)
    got = [(r.timestamp - epoch) // dt.timedelta(milliseconds=1) for r in rows]
    exact = [decimal.Decimal(float(s) * 1000.0).quantize(decimal.Decimal(1), rounding=decimal.ROUND_HALF_UP)
             for s in seconds]
    assert got == [int(x) for x in exact]
    assert got[:6] == [-2, -3, 1, 0, 3, -1500]


@pytest.mark.spark
def test_text_lines_split_the_same_by_bytes_and_by_characters(spark: Any, tmp_path: pathlib.Path) -> None:
    # The common line is cut by byte offsets, a line with runs of blanks by characters;
    # multi-byte label values, blanks inside values and runs of blanks between the parts
    # must all give the same samples, and the verdicts must not depend on whether heads
    # are parsed once each (broadcast) or on every line.
    heads = ['{__name__="up", group="gé", broker="b 1"}', '{__name__="up", group="g  two", broker="ü"}']
    lines = []
    for i, head in enumerate(heads):
        lines += [f"{head} 1 {T_MS + i}", f"{head}  0   {T_MS + 15000 + i}  ", f"{head} 1"]
    lines += ['{__name__="up", group="g" 1 5', "{} 1 2", "garbage"]
    path = _write(tmp_path, "dump.txt", "\n".join(lines) + "\n")
    raw = readers._text_lines(spark, [path])
    once = readers._parse_dump(raw, keyed=True).orderBy("raw").collect()
    every = readers._parse_dump(raw, keyed=True, per_line=True).orderBy("raw").collect()
    assert once == every
    got = sorted((r.group, r.broker, r.value, r.timestamp) for r in once if r.ok)
    ms = [dt.datetime.fromtimestamp(x / 1000, tz=dt.UTC).replace(tzinfo=None) for x in (T_MS, T_MS + 1, T_MS + 15000, T_MS + 15001)]
    assert got == sorted([("gé", "b 1", 1.0, ms[0]), ("gé", "b 1", 0.0, ms[2]),
                          ("g  two", "ü", 1.0, ms[1]), ("g  two", "ü", 0.0, ms[3])])
    assert sum(1 for r in once if not r.ok) == 5


@pytest.mark.spark
def test_a_large_query_range_document_is_read_by_series_in_parallel(spark: Any, tmp_path: pathlib.Path) -> None:
    # A compact document (Prometheus' own form) is cut at ``{"metric":`` into series read
    # by several tasks; the same document pretty-printed is parsed whole. Both must give
    # the same samples, including a label value that spells the delimiter (escaped) and a
    # multi-byte one, and a truncated compact document must still be rejected with its line.
    result = [
        {"metric": {"__name__": PERM_NAME, "group": f"g{i}", "broker": f"g{i}-0", "role": "master",
                    "note": '{"metric":' if i % 2 else "é"},
         "values": [[T_MS / 1000 + 15 * k, str(k % 4)] for k in range(120)]}
        for i in range(40)
    ]
    doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    for sub in ("compact", "pretty"):
        (tmp_path / sub).mkdir()
    compact = _write(tmp_path / "compact", "day.json", json.dumps(doc, separators=(",", ":"), ensure_ascii=False))
    pretty = _write(tmp_path / "pretty", "day.json", json.dumps(doc, indent=1))
    assert readers.splittable(*readers._head_and_tail(spark, compact))
    assert readers.reads_by_series(spark, compact)
    assert not readers.splittable(*readers._head_and_tail(spark, pretty))
    before = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "32768")  # the file is ~100 KB
    try:
        assert readers._records_as_series(spark, [compact]).rdd.getNumPartitions() >= 2
        got = {}
        for name, path in (("compact", compact), ("pretty", pretty)):
            files = readers.list_inputs(spark, [path])
            rows = readers.read_parsed(spark, files, keyed=True).collect()
            assert all(r.ok for r in rows), name
            got[name] = sorted((r.timestamp, r.group, r.broker, r.value) for r in rows)
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", before)
    assert len(got["compact"]) == 40 * 120
    assert got["compact"] == got["pretty"]

    text = pathlib.Path(compact).read_text(encoding="utf-8")
    truncated = _write(tmp_path, "truncated.json", text[: len(text) // 2])
    config = job.JobConfig(inputs=(truncated,), out=str(tmp_path / "out"))
    with pytest.raises(InputError, match=r"truncated\.json:1: malformed JSON"):
        job.run(spark, config, progress=lambda _m: None)


def test_each_query_range_series_is_parsed_once(spark: Any, tmp_path: pathlib.Path) -> None:
    """Spark infers a ``size(array) > 0`` filter for ``explode`` and pushes it below the
    projection that parses the JSON, which then runs again in that filter: every series
    (and every whole document) went through the JSON reader three or more times, half of
    the read's time (one 40-group day: 5.4 s, 2.4 s without). No filter parses JSON now,
    and the projection parses the label map and the values (one ``from_json`` each, as
    Spark's JSON schema pruning splits them)."""
    result = [{"metric": {"__name__": PERM_NAME, "group": f"g{i}", "broker": f"g{i}-0",
                          "role": "master"},
               "values": [[T_MS / 1000 + 15 * k, str(k % 4)] for k in range(10)]}
              for i in range(3)]
    doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    (tmp_path / "compact").mkdir()
    (tmp_path / "pretty").mkdir()
    compact = _write(tmp_path / "compact", "day.json", json.dumps(doc, separators=(",", ":")))
    pretty = _write(tmp_path / "pretty", "day.json", json.dumps(doc, indent=1))
    for path in (compact, pretty):
        df = readers.read_query_range(spark, [path], keyed=True)
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert not [line for line in plan.splitlines()
                    if "Filter" in line and "from_json(" in line], plan
        assert plan.count("from_json(") <= 2, plan
        assert df.where("ok").count() == 3 * 10


def _series_text(labels: dict[str, str], values: list[list[Any]], *, values_first: bool = False) -> str:
    metric = '"metric":' + json.dumps(labels, separators=(",", ":"))
    pairs = '"values":' + json.dumps(values, separators=(",", ":"))
    return "{" + (f"{pairs},{metric}" if values_first else f"{metric},{pairs}") + "}"


def _matrix_text(series: list[str]) -> str:
    return '{"status":"success","data":{"resultType":"matrix","result":[' + ",".join(series) + "]}}"


def _pairs(n: int, offset: int = 0) -> list[list[Any]]:
    return [[T_MS / 1000 + 15 * k, str((k + offset) % 4)] for k in range(n)]


# Valid compact documents that the cut at ``{"metric":`` would misread: a series written
# values-before-metric (glued to the series before it, which the JSON reader stops after:
# it vanished without a rejected row), and a label named ``metric`` that comes first (what
# Prometheus writes for a series without ``__name__``: the cut fell inside the labels).
SERIES_SPLIT_TRAPS = {
    "values_first": _matrix_text([
        _series_text({"__name__": PERM_NAME, "group": f"g{i}", "broker": f"g{i}-0"}, _pairs(6, i),
                     values_first=i == 2)
        for i in range(4)
    ]),
    "metric_label_first": _matrix_text([
        _series_text({"metric": "x", "job": "y"}, _pairs(6)),
        _series_text({"__name__": PERM_NAME, "group": "g1", "broker": "g1-0"}, _pairs(6, 1)),
        _series_text({"metric": "m", "__name__": PERM_NAME, "group": "g2"}, _pairs(6, 2)),
    ]),
}


_HIST = '"histograms":[[1793534400,{"count":"2","sum":"3","buckets":[[0,"1","2","2"]]}]]'
SERIES_SPLIT_CHECKS = {
    # name: (document, read by series?)
    "prometheus": (_matrix_text([
        _series_text({"__name__": "up", "job": "x", "metric": "metric", "note": 'say "metric'}, _pairs(3)),
        _series_text({"__name__": "up", "note": '{"metric":{', "metric": "y"}, _pairs(3)),
    ]), True),
    **{name: (text, False) for name, text in SERIES_SPLIT_TRAPS.items()},
    "blanks_around_a_later_metric_key": (_matrix_text([
        _series_text({"__name__": "up"}, _pairs(3)),
        '{"values":[[1793534400,"1"]], "metric" : {"__name__":"up","job":"y"}}',
    ]), False),
    "a_later_series_with_blanks": (_matrix_text([
        _series_text({"__name__": "up"}, _pairs(3)),
        '{"metric": {"__name__":"up","job":"y"},"values":[[1793534400,"1"]]}',
    ]), False),
    "values_and_histograms": (_matrix_text([
        _series_text({"__name__": "up"}, _pairs(3))[:-1] + "," + _HIST + "}",
    ] * 2), True),
    # Only histograms: nothing on the whole-document path, a rejected record by series.
    "histograms_only": (_matrix_text([
        _series_text({"__name__": "up"}, _pairs(3)),
        '{"metric":{"__name__":"h"},' + _HIST + "}",
    ]), False),
    # ... and with a values-first series after it, the counts of ``{"metric":{`` and
    # ``"values":[`` agree again: the ``metric`` keys must be counted too.
    "histograms_only_then_values_first": (_matrix_text([
        _series_text({"__name__": "up"}, _pairs(3)),
        '{"metric":{"__name__":"h"},' + _HIST + "}",
        _series_text({"__name__": "up", "job": "y"}, _pairs(3), values_first=True),
    ]), False),
}


@pytest.mark.parametrize("case", list(SERIES_SPLIT_CHECKS))
def test_series_split_check_counts_across_chunks(case: str) -> None:
    text, expected = SERIES_SPLIT_CHECKS[case]
    assert readers.splittable(text.encode()[:4096], text.encode()[-256:])
    data = text.encode()
    for size in (len(data), 64, 7, 1):
        chunks = [data[i:i + size] for i in range(0, len(data), size)]
        assert readers.splits_at_series(readers.count_sequences(chunks)) is expected, size
    # The two-scan count a local file gets (on its memory map) counts the same.
    assert readers.count_mapped(data) == readers.count_sequences([data])


@pytest.mark.spark
@pytest.mark.parametrize("case", list(SERIES_SPLIT_TRAPS))
def test_a_valid_compact_document_the_series_cut_would_misread(spark: Any, tmp_path: pathlib.Path,
                                                               case: str) -> None:
    # Such a file passes the head and tail checks but takes the whole-document path: the
    # same rows as its pretty-printed twin.
    text = SERIES_SPLIT_TRAPS[case]
    doc = json.loads(text)
    got = {}
    for sub, body in (("compact", text), ("pretty", json.dumps(doc, indent=1))):
        (tmp_path / sub).mkdir()
        files = readers.list_inputs(spark, [_write(tmp_path / sub, "day.json", body)])
        rows = readers.read_parsed(spark, files).collect()
        got[sub] = sorted(((r.timestamp, r.metric, sorted((r.labels or {}).items()), r.value, r.ok, r.weight)
                           for r in rows), key=repr)
    compact = str(tmp_path / "compact" / "day.json")
    assert readers.splittable(*readers._head_and_tail(spark, compact))
    assert not readers.reads_by_series(spark, compact)
    # A file on HDFS or S3 is counted in the JVM: the same counts.
    assert readers._counts_in_jvm(spark, compact, chunk_bytes=7) == readers.count_sequences([text.encode()])
    assert got["compact"] == got["pretty"]
    # Every sample of every series, and only a series without ``__name__`` rejected.
    result = doc["data"]["result"]
    assert len(got["compact"]) == sum(len(s["values"]) for s in result)
    named = sum(len(s["values"]) for s in result if "__name__" in s["metric"])
    assert sum(1 for row in got["compact"] if row[4]) == named
