"""Read Prometheus exports into one normalised long table, with Spark.

Why this module exists: platform teams keep months of Prometheus data in whatever form
they could get out of it — HTTP API ``query_range`` JSON, ``promtool tsdb dump`` text, or
text/OpenMetrics exposition files with timestamps — on local disks or HDFS/S3. The SLA
transforms must not care which. This module detects each file's form from its first bytes
(never from its name), parses every form with Spark column expressions over the text
source (no Python loop over rows, so a month of 200 groups parses on the executors), and
returns one table::

    timestamp: timestamp (UTC)   metric: string   labels: map<string,string>   value: double

Rejected input is never dropped silently: every parsed row carries ``ok``; the caller
counts the rejects in the same pass (a Spark ``Observation``) and, on error, asks
:func:`locate_first_bad` for the file and line number to show the user.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# The normalised long table: the contract between the readers and the transforms.
SAMPLES_SCHEMA = StructType(
    [
        StructField("timestamp", TimestampType(), nullable=False),
        StructField("metric", StringType(), nullable=False),
        StructField("labels", MapType(StringType(), StringType()), nullable=False),
        StructField("value", DoubleType(), nullable=True),
    ]
)

# Every reader returns this: the sample columns plus provenance and a verdict.
# ``weight`` is how many input lines the row stands for (a rejected JSON document counts
# all of its lines; a text line counts one).
PARSED_COLUMNS = ["timestamp", "metric", "labels", "value", "source_file", "raw", "weight", "ok"]

# The job's hot path needs only these labels. Reading them straight out of the label text
# (``keyed=True``) instead of building a map per sample halves the parsing cost and the
# width of every row that crosses the shuffle. ``group`` is null when the label is absent
# or empty (Prometheus treats an empty label as absent); ``broker``/``role``/``mode`` are
# ``""``. ``mode`` only tells the series of ``understudy_group_mode_entered_timestamp_seconds``
# apart (docs/sla.md "Event times"); the shuffle never carries it.
KEY_LABELS = ("group", "broker", "role", "mode")
# What a rejected keyed sample shows of its labels.
_SHOWN_LABELS = ("group", "broker", "role")
KEYED_COLUMNS = ["timestamp", "metric", *KEY_LABELS, "value", "source_file", "raw", "weight", "ok"]

# query_range JSON: {"status": "success", "data": {"resultType": "matrix", "result": [...]}}.
# Sample pairs are [<unix seconds as a number>, "<value as a string>"]. Each pair is read
# as one string: Spark's JSON reader renders a nested array as JSON text when the schema
# says string (``[1795211698.96,"3"]`` becomes ``[1.79521169896E9,"3"]``: it re-renders a
# number with a fraction from its double), which is ~3x cheaper than
# materialising an array of two strings per sample and exploding it; the text is then cut
# with string functions (:func:`_pair_parts`).
_SERIES_SCHEMA = StructType(
    [
        StructField("metric", MapType(StringType(), StringType())),
        StructField("values", ArrayType(StringType())),
    ]
)
_RESULT_SCHEMA = ArrayType(_SERIES_SCHEMA)
QUERY_RANGE_SCHEMA = StructType(
    [
        StructField("status", StringType()),
        StructField("error", StringType()),
        StructField(
            "data",
            StructType(
                [
                    StructField("resultType", StringType()),
                    StructField("result", _RESULT_SCHEMA),
                ]
            ),
        ),
        # Some tools save only the ``data`` object; accept it too.
        StructField("resultType", StringType()),
        StructField("result", _RESULT_SCHEMA),
    ]
)

# Regexes are written without nested alternation (the "unrolled loop" form) so Java's
# regex engine scans a label set in linear time.
_QUOTED = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_PAIR = rf"{_LABEL_NAME}\s*=\s*{_QUOTED}"
_LABEL_PAIR_CAPTURE = rf'({_LABEL_NAME})\s*=\s*"([^"\\]*(?:\\.[^"\\]*)*)"'
_NAME_PAIR = rf"__name__\s*=\s*{_QUOTED}"
_NAME_PAIR_CAPTURE = r'__name__\s*=\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"'
_LABEL_SET = rf"\{{\s*(?:{_LABEL_PAIR}\s*(?:,\s*{_LABEL_PAIR}\s*)*,?\s*)?\}}"
_NUMBER = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[Nn]a[Nn]|[Ii]nf(?:inity)?)"
_TS_ANY = r"-?[0-9]+(?:\.[0-9]+)?"
# How an exposition's first sample line starts: a name, labels, a number.
_EXPOSITION_HEAD = rf"[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{{[^\n]*\}})?[ \t]+{_NUMBER}(?:\s|$)"
# Lines of an exposition that carry no sample and are not errors.
EXPOSITION_SKIP = r"^\s*(#.*)?$"

# A timestamp below this is in seconds (OpenMetrics), above it in milliseconds (text
# format 0.0.4): 1e11 s is the year 5138, 1e11 ms is 1973.
_SECONDS_BELOW = 1e11

# The instants a sample may carry, in milliseconds: years 1 to 9999, what a TIMESTAMP, an
# ISO-8601 date and the report's tables can all hold. Outside them (NaN, infinities, a
# garbled number) a sample is rejected, not the job failed by an overflowing cast.
MIN_MS, MAX_MS = -62_135_596_800_000, 253_402_300_799_999


def timestamp_of_millis(ms: Column) -> Column:
    """Whole milliseconds (bigint) -> TIMESTAMP, or null outside ``MIN_MS``..``MAX_MS``."""
    return F.when(ms.between(MIN_MS, MAX_MS), F.timestamp_millis(ms))


def millis_of(x: Column) -> Column:
    """Milliseconds as a double -> the nearest whole millisecond (bigint; halves away from
    zero, as ``round``), or null outside ``MIN_MS``..``MAX_MS`` (NaN and infinities too).

    ``round`` on a double goes through ``BigDecimal.valueOf`` (a ``Double.toString`` and a
    parse per sample: ~6 % of the ``query_range`` read in a profile); ``floor`` and the
    fraction give the same millisecond for every double of magnitude below 2^52, which
    this range is, and ``x - floor(x)`` is exact there."""
    whole = F.floor(x)
    frac = x - whole
    up = (frac > 0.5) | ((frac == 0.5) & (x > 0))
    return F.when(x.between(MIN_MS, MAX_MS), whole + up.cast(LongType()))


class ExportFormat(StrEnum):
    """The three export forms the job understands."""

    QUERY_RANGE = "query_range"
    DUMP = "dump"
    EXPOSITION = "openmetrics"


class InputError(ValueError):
    """Input that cannot be read: names the file and, where it can, the line."""


@dataclass(frozen=True, slots=True)
class InputFile:
    """One file to read and the form its content says it is in."""

    path: str
    form: ExportFormat


@dataclass(frozen=True, slots=True)
class BadLine:
    """Where the first rejected input is, for the error message."""

    path: str
    line: int | None
    reason: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.reason}"


def detect_format(head: bytes, *, path: str) -> ExportFormat:
    """Decide a file's form from its first bytes.

    ``{"`` opens a JSON document; ``{name=`` opens a dump line; ``#`` or a metric name
    opens an exposition. Anything else is an error naming the file and line 1.
    """
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    stripped = text.lstrip()
    line_no = 1 + text[: len(text) - len(stripped)].count("\n")
    if not stripped:
        raise InputError(f"{path}:{line_no}: empty file: expected a Prometheus export")
    if stripped.startswith("{"):
        rest = stripped[1:].lstrip()
        if rest.startswith('"'):
            return ExportFormat.QUERY_RANGE
        if re.match(r"[a-zA-Z_][a-zA-Z0-9_]*\s*=", rest):
            return ExportFormat.DUMP
    elif stripped.startswith("#") or re.match(_EXPOSITION_HEAD, stripped):
        return ExportFormat.EXPOSITION
    first = stripped.splitlines()[0][:60]
    raise InputError(
        f"{path}:{line_no}: unknown format: {first!r} is not query_range JSON, "
        "promtool tsdb dump text or a text/OpenMetrics exposition"
    )


def _hadoop(spark: SparkSession) -> tuple[Any, Any]:
    jvm: Any = spark.sparkContext._jvm
    conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
    return jvm, conf


def list_inputs(spark: SparkSession, patterns: Sequence[str]) -> list[InputFile]:
    """Expand files, directories and globs (any Hadoop path) and detect each file's form.

    Uses the Hadoop FileSystem API on the driver, so ``hdfs://`` and ``s3a://`` work the
    same as local paths, and reads only the first 4 KiB of each file.
    """
    jvm, conf = _hadoop(spark)
    found: list[InputFile] = []
    for pattern in patterns:
        hpath = jvm.org.apache.hadoop.fs.Path(pattern)
        fs = hpath.getFileSystem(conf)
        statuses = fs.globStatus(hpath)
        if statuses is None or len(statuses) == 0:
            raise InputError(f"{pattern}: no such file or no file matches")
        for status in _expand(fs, statuses):
            path = str(status.getPath().toString())
            stream = fs.open(status.getPath())
            try:
                head = bytes(stream.readNBytes(4096))
            finally:
                stream.close()
            found.append(InputFile(path=path, form=detect_format(head, path=path)))
    if not found:
        raise InputError(f"no input files in {', '.join(patterns)}")
    return sorted(set(found), key=lambda f: f.path)


def _expand(fs: Any, statuses: Iterable[Any]) -> Iterable[Any]:
    for status in statuses:
        name = str(status.getPath().getName())
        if name.startswith((".", "_")):
            continue  # Hadoop's hidden files: _SUCCESS, .crc
        if status.isDirectory():
            yield from _expand(fs, fs.listStatus(status.getPath()))
        else:
            yield status


def _labels_map(label_set: Column) -> Column:
    """``{a="b", c="d"}`` -> map(a -> b, c -> d) without ``__name__``, unescaping
    ``\"``, ``\\`` and ``\n``.

    Two regex scans and no lambda on the common path: higher-order functions are not
    code-generated and cost more than the scans; only values with a backslash pay for
    the unescaping.
    """
    rest = F.regexp_replace(label_set, _NAME_PAIR + r"\s*,?", "")
    keys = F.regexp_extract_all(rest, F.lit(_LABEL_PAIR_CAPTURE), 1)
    values = F.regexp_extract_all(rest, F.lit(_LABEL_PAIR_CAPTURE), 2)
    values = F.when(rest.contains("\\"), F.transform(values, _unescape)).otherwise(values)
    return F.map_from_arrays(keys, values)


def _unescape(v: Column) -> Column:
    return F.regexp_replace(
        F.regexp_replace(F.regexp_replace(v, r"\\n", "\n"), r'\\"', '"'), r"\\\\", r"\\"
    )


def _label(label_set: Column, name: str) -> Column:
    """One label's value out of a label set's text (``{a="b", ...}``), ``""`` when absent.

    The regex walks whole ``name="value"`` pairs from the opening brace (lazily, so it
    stops at the first pair named ``name``); it can never start matching inside another
    label's value, whatever that value contains.
    """
    rx = rf'^\{{\s*(?:{_LABEL_PAIR}\s*,\s*)*?{name}\s*=\s*"([^"\\]*(?:\\.[^"\\]*)*)"'
    value = F.regexp_extract(label_set, rx, 1)
    return F.when(value.contains("\\"), _unescape(value)).otherwise(value)


def _key_labels(label_set: Column) -> list[Column]:
    group = _label(label_set, "group")
    return [
        F.when(group != "", group).alias("group"),
        _label(label_set, "broker").alias("broker"),
        _label(label_set, "role").alias("role"),
        _label(label_set, "mode").alias("mode"),
    ]


def _metric_name(label_set: Column) -> Column:
    """The ``__name__`` label of a dump line's label set, or null."""
    name = F.regexp_extract(label_set, _NAME_PAIR_CAPTURE, 1)
    return F.when(name != "", name)


def _sample_parts(lines: DataFrame) -> DataFrame:
    """``<head> <value> <timestamp>`` -> columns ``head`` (bytes), ``v``, ``t`` next to the
    line's own columns. Label values may contain spaces, so the line is split from the
    right; blanks around the parts are trimmed.

    The common line (one blank before the value and one before the timestamp) is cut by
    byte offsets: ``length`` and a character-indexed ``substring`` walk every UTF-8
    character of every line, which cost more than reading the file. A line with a run of
    blanks around those two, or with fewer than two blanks, takes the character-based
    path; blanks inside a label value do not matter to the cut. (Searching the whole line
    for two blanks in a row was ~20 % of the dump's reading in a profile: a byte compare
    at every blank.) The head stays bytes here (it is only a key for
    :func:`_with_heads`); the parts are computed in separate ``select``s so each is
    computed once per line.
    """
    keep = lines.columns
    a = lines.select(*keep, F.rtrim("raw").alias("_line"))
    b = a.select(*keep, "_line", F.substring_index("_line", " ", -2).alias("_tail"))
    line = F.col("_line").cast(BinaryType())
    head_bytes = F.octet_length("_line") - F.octet_length("_tail") - 1
    # The tail is "<value> <timestamp>" with neither empty, and the head does not end in a blank.
    simple = (head_bytes >= 1) & ~F.startswith("_tail", F.lit(" ")) & (
        F.substring(line, head_bytes, 1) != F.lit(b" ")
    )
    fast_head = F.substring(line, F.lit(1), F.greatest(head_bytes, F.lit(0)))
    # The general path: peel the timestamp, trim, peel the value, trim.
    ts_text = F.substring_index("_line", " ", -1)
    rest = F.rtrim(F.substring("_line", F.lit(1), F.greatest(F.length("_line") - F.length(ts_text) - 1, F.lit(0))))
    value_text = F.substring_index(rest, " ", -1)
    head = F.rtrim(F.substring(rest, F.lit(1), F.greatest(F.length(rest) - F.length(value_text) - 1, F.lit(0))))
    return b.select(
        *keep,
        F.when(simple, fast_head).otherwise(head.cast(BinaryType())).alias("head"),
        F.when(simple, F.substring_index("_tail", " ", 1)).otherwise(value_text).alias("v"),
        F.when(simple, F.substring_index("_tail", " ", -1)).otherwise(ts_text).alias("t"),
    )


def _finish(df: DataFrame, *, keyed: bool) -> DataFrame:
    return df.select(*(KEYED_COLUMNS if keyed else PARSED_COLUMNS))


def _labels(label_set: Column, *, keyed: bool) -> list[Column]:
    return _key_labels(label_set) if keyed else [_labels_map(label_set).alias("labels")]


def _text_lines(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    return spark.read.text(list(paths)).select(
        F.col("value").alias("raw"), F.col("_metadata.file_path").alias("source_file")
    )


def _extra(lines: DataFrame) -> list[str]:
    """Columns a caller carries through parsing (the line id of :func:`locate_first_bad`)."""
    return [c for c in lines.columns if c not in ("raw", "source_file")]


# The most distinct series heads (label sets) parsed once each and broadcast to the lines;
# above it every line parses its own head (same expressions, same verdicts, slower).
MAX_DISTINCT_HEADS = 200_000


def _dump_head(head: Column, *, keyed: bool) -> list[Column]:
    """What a dump line's head (``{__name__="m", a="b"}``) says: metric, labels, shape."""
    metric = _metric_name(head)
    return [
        metric.alias("metric"),
        *_labels(head, keyed=keyed),
        (head.rlike(f"^{_LABEL_SET}$") & metric.isNotNull()).alias("head_ok"),
    ]


def _exposition_head(head: Column, *, keyed: bool) -> list[Column]:
    """What an exposition line's head (``m{a="b"}`` or ``m``) says: metric, labels, shape."""
    name = F.regexp_extract(head, f"^({_METRIC_NAME})", 1)
    return [
        name.alias("metric"),
        *_labels(F.substring(head, F.length(name) + 1, 1 << 30), keyed=keyed),
        head.rlike(f"^{_METRIC_NAME}(?:{_LABEL_SET})?$").alias("head_ok"),
    ]


def _with_heads(parts: DataFrame, describe: Callable[[Column], list[Column]], *, per_line: bool) -> DataFrame:
    """``parts`` plus what each line's head says (``describe``), head by head.

    An export repeats one label set on every sample of a series: a dump of 200 groups has
    a few thousand distinct heads over hundreds of millions of lines. So the regexes run
    once per distinct head, on the driver's small table, which is broadcast back to the
    lines (one cheap pass to find the heads, one hash lookup per line), instead of five
    Java regex scans per line. ``per_line`` (or more than ``MAX_DISTINCT_HEADS`` heads)
    applies the same expressions to every line instead; the verdicts are the same.
    """
    if not per_line:
        spark = parts.sparkSession
        found = parts.select("head").distinct().limit(MAX_DISTINCT_HEADS + 1).collect()
        if len(found) <= MAX_DISTINCT_HEADS:
            heads = spark.createDataFrame([(row[0],) for row in found], "head binary")
            table = heads.select("head", *describe(F.col("head").cast(StringType())))
            return parts.join(F.broadcast(table), "head", "left").withColumn(
                "head_ok", F.coalesce("head_ok", F.lit(False))
            )
    return parts.select("*", *describe(F.col("head").cast(StringType())))


def _integer_shaped(t: Column) -> Column:
    """``t`` is ``-?[0-9]+`` wherever ``try_cast(t as bigint)`` is not null: that cast
    also takes a ``+`` sign and blanks around the digits, which the shape refuses, so a
    first byte of ``-`` or a digit and a last byte that is a digit are all that is left to
    check (a line holds no line break). A regex match per line cost ~4 % of the dump's
    reading in a profile."""
    first, last = F.substring(t, 1, 1), F.substring(t, -1, 1)
    return ((first == "-") | first.between("0", "9")) & last.between("0", "9")


def read_dump(spark: SparkSession, paths: Sequence[str], *, keyed: bool = False) -> DataFrame:
    """``promtool tsdb dump`` text: one sample per line, timestamp in milliseconds.

    Runs one quick Spark job at once to collect the distinct series heads (see
    :func:`_with_heads`); the lines themselves are parsed lazily.
    """
    return _finish(_parse_dump(_text_lines(spark, paths), keyed=keyed), keyed=keyed)


def _parse_dump(lines: DataFrame, *, keyed: bool, per_line: bool = False) -> DataFrame:
    extra = _extra(lines)
    described = _with_heads(
        _sample_parts(lines), lambda head: _dump_head(head, keyed=keyed), per_line=per_line
    )
    labels = list(KEY_LABELS) if keyed else ["labels"]
    parsed = described.select(
        "raw",
        "source_file",
        *extra,
        timestamp_of_millis(F.col("t").try_cast(LongType())).alias("timestamp"),
        "metric",
        *labels,
        F.col("v").try_cast(DoubleType()).alias("value"),
        F.lit(1).alias("weight"),
        (F.col("head_ok") & _integer_shaped(F.col("t"))).alias("shape_ok"),
    )
    ok = F.col("shape_ok") & F.col("timestamp").isNotNull() & F.col("value").isNotNull()
    return parsed.withColumn("ok", ok)


def read_exposition(spark: SparkSession, paths: Sequence[str], *, keyed: bool = False) -> DataFrame:
    """Text (timestamps in ms) or OpenMetrics (timestamps in s) exposition with timestamps.

    Comment lines (``# HELP``, ``# TYPE``, ``# EOF``) and blank lines carry no sample and
    are skipped; a sample line without a timestamp cannot be placed in time and is
    rejected like any malformed line. Like :func:`read_dump`, runs one quick job at once
    to collect the distinct series heads.
    """
    return _finish(_parse_exposition(_text_lines(spark, paths), keyed=keyed), keyed=keyed)


def _parse_exposition(lines: DataFrame, *, keyed: bool, per_line: bool = False) -> DataFrame:
    extra = _extra(lines)
    lines = lines.where(~F.col("raw").rlike(EXPOSITION_SKIP))
    described = _with_heads(
        _sample_parts(lines), lambda head: _exposition_head(head, keyed=keyed), per_line=per_line
    )
    labels = list(KEY_LABELS) if keyed else ["labels"]
    ts = F.col("t").try_cast(DoubleType())
    ts_ms = F.when(F.abs(ts) < _SECONDS_BELOW, ts * 1000.0).otherwise(ts)
    parsed = described.select(
        "raw",
        "source_file",
        *extra,
        F.timestamp_millis(millis_of(ts_ms)).alias("timestamp"),
        "metric",
        *labels,
        F.col("v").try_cast(DoubleType()).alias("value"),
        F.lit(1).alias("weight"),
        (F.col("head_ok") & F.col("t").rlike(f"^{_TS_ANY}$")).alias("shape_ok"),
    )
    ok = F.col("shape_ok") & F.col("timestamp").isNotNull() & F.col("value").isNotNull()
    return parsed.withColumn("ok", ok)


# A compact ``query_range`` document (what Prometheus writes) is read as records cut at
# ``{"metric":`` with a splittable text read, one series per record, so one large document
# is parsed by many tasks instead of one. The sequence cannot occur inside a JSON string
# (its ``"`` would be escaped), but a valid matrix may hold it where no series begins (a
# first label named ``metric``) and may begin a series without it (``values`` written
# first): :func:`splits_at_series` checks each file for both before it is read so.
SERIES_DELIMITER = '{"metric":'
# What a file must start with to be read by series: the header of a successful matrix
# (or only its ``data`` object) and its first series, within the first 4 KiB.
_SPLIT_HEAD = re.compile(
    r'\ufeff?\s*\{\s*(?:"status"\s*:\s*"success"\s*,\s*"data"\s*:\s*\{\s*)?'
    r'"resultType"\s*:\s*"matrix"\s*,\s*"result"\s*:\s*\[\s*\{"metric":'
)
# ... and end with: the last series' ``}``, the result's ``]``, the data's ``}`` (and the
# document's). Anything after the data object (``"warnings"``) takes the whole-document path.
_SPLIT_TAIL = re.compile(r'\}\s*\]\s*\}\s*(?:\}\s*)?$')
_HEAD_BYTES = 4096


def splittable(head: bytes, tail: bytes) -> bool:
    """Whether a ``query_range`` file whose first bytes are ``head`` (at most 4 KiB) and
    last bytes ``tail`` can be read series by series: a successful matrix with its first
    series in ``head`` starting with ``{"metric":`` (Prometheus' own form), and a complete
    end. Every other file (pretty printed, truncated, with warnings, an error document) is
    parsed as one document, and so is one that fails :func:`splits_at_series`."""
    text = head.decode("utf-8", errors="replace")
    end = tail.decode("utf-8", errors="replace")
    return _SPLIT_HEAD.match(text) is not None and _SPLIT_TAIL.search(end) is not None


# What :func:`splits_at_series` counts. None of them can lie inside a JSON string: each
# has a ``"`` right after a letter or a brace, which inside a string would be ``\"``.
_DELIMITER_BYTES = SERIES_DELIMITER.encode()
_SERIES_START = b'{"metric":{'
_VALUES_KEY = b'"values":['
_METRIC = b'"metric"'
# ``"metric"`` as a label's name or value (labels are strings), written compactly.
_METRIC_LABEL = (b'"metric":"', b'"metric",', b'"metric"}')
_COUNTED = (_DELIMITER_BYTES, _SERIES_START, _VALUES_KEY, _METRIC, *_METRIC_LABEL)
_CHUNK_BYTES = 8 << 20


def splits_at_series(counts: Mapping[bytes, int]) -> bool:
    """Whether a file that passed :func:`splittable`, given by how often each sequence of
    ``_COUNTED`` occurs in it (:func:`count_sequences`), is cut at ``{"metric":`` into
    exactly its series, each with its ``values``, so that the series path reads the same
    samples as the whole-document path:

    - every ``{"metric":`` is a ``{"metric":{``, an object whose first key ``metric``
      holds an object: a series (label values are strings), not labels whose first is
      named ``metric`` (what Prometheus writes for a series without ``__name__``), which
      the cut would split in two;
    - every other ``"metric"`` is a label's name or value (``"metric":"``, ``"metric",``,
      ``"metric"}``), so no series has its ``metric`` key after another key (``values``
      first) or with blanks: that series would be glued to the record before it, and the
      JSON reader, which stops after that record's own series, would drop it without a
      rejected row;
    - there are as many ``"values":[`` as series: a series with only native
      ``histograms`` (neither path reads them) adds nothing on the whole-document path but
      would be a rejected record here. Without the previous point a ``values``-first
      series after it would make the numbers agree again.

    A file that fails goes to the whole-document path, so blanks in odd places cost only
    speed."""
    series = counts[_SERIES_START]
    metric_keys = counts[_METRIC] - sum(counts[p] for p in _METRIC_LABEL)
    return counts[_DELIMITER_BYTES] == series == metric_keys == counts[_VALUES_KEY]


def count_sequences(chunks: Iterable[bytes]) -> dict[bytes, int]:
    """How often each of ``_COUNTED`` occurs in a file given as its bytes in order:
    ``bytes.count`` per chunk, with the last bytes of the previous chunk in front (and
    what lies wholly in them taken off again), so a sequence across a chunk boundary is
    counted once."""
    counts = dict.fromkeys(_COUNTED, 0)
    keep = max(len(p) for p in _COUNTED) - 1
    carry = b""
    for chunk in chunks:
        buf = carry + chunk
        for p in _COUNTED:
            counts[p] += buf.count(p) - carry.count(p)
        carry = buf[-keep:]
    return counts


def _counts_in_jvm(spark: SparkSession, path: str, chunk_bytes: int = _CHUNK_BYTES) -> dict[bytes, int]:
    """:func:`count_sequences` for a file on any Hadoop file system, counted in the JVM:
    the bytes never cross to Python (through Py4J a 145 MB file took 10 s). Each chunk is
    decoded as ISO-8859-1 (one char per byte, so the ASCII sequences match as bytes) and
    counted with ``Matcher.results().count()``; the ``keep`` bytes carried to the front of
    the next chunk are counted again in that region and taken off."""
    jvm, conf = _hadoop(spark)
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(conf)
    regex = jvm.java.util.regex.Pattern
    matchers = [regex.compile(regex.quote(p.decode("ascii"))).matcher("") for p in _COUNTED]
    latin1 = jvm.java.nio.charset.StandardCharsets.ISO_8859_1
    keep = max(len(p) for p in _COUNTED) - 1
    counts = dict.fromkeys(_COUNTED, 0)
    buf = jvm.java.nio.ByteBuffer.allocate(chunk_bytes + keep)
    stream = fs.open(hpath)
    try:
        channel = jvm.java.nio.channels.Channels.newChannel(stream)
        carry = 0
        while True:
            read = 0
            while buf.hasRemaining():
                n = int(channel.read(buf))
                if n < 0:
                    break
                read += n
            if read == 0:
                break
            buf.flip()
            text = latin1.decode(buf.duplicate())
            size = int(text.length())
            for p, matcher in zip(_COUNTED, matchers, strict=True):
                counts[p] += int(matcher.reset(text).results().count())
                if carry:
                    counts[p] -= int(matcher.reset().region(0, carry).results().count())
            carry = min(keep, size)
            buf.position(size - carry)
            buf.compact()
    finally:
        stream.close()
    return counts


def _local_file(spark: SparkSession, path: str) -> str | None:
    """The local path of ``path`` if it is on the local file system (``file:``, or no
    scheme when that is the default file system), else None."""
    jvm, conf = _hadoop(spark)
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(conf)
    if str(fs.getScheme()) != "file":
        return None
    return str(fs.makeQualified(hpath).toUri().getPath())


def reads_by_series(spark: SparkSession, path: str) -> bool:
    """Whether the ``query_range`` file at ``path`` is read series by series: its head and
    tail pass :func:`splittable` (4 KiB), then its bytes :func:`splits_at_series` (one
    sequential read on the driver: a local file in Python, any other in the JVM)."""
    if not splittable(*_head_and_tail(spark, path)):
        return False
    local = _local_file(spark, path)
    if local is None:
        return splits_at_series(_counts_in_jvm(spark, path))
    st = os.stat(local)
    return _local_splits(local, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _local_splits(path: str, _size: int, _mtime_ns: int) -> bool:
    """:func:`splits_at_series` of a local file, once per version of it (the topic pass
    reads the same files again in the same run), counted on its memory map."""
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return splits_at_series(count_sequences([]))
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return splits_at_series(count_mapped(mapped))


def count_mapped(buf: bytes | mmap.mmap) -> dict[bytes, int]:
    """:func:`count_sequences` of one whole buffer in two scans instead of seven: every
    counted sequence but ``"values":[`` contains ``"metric"``, and there are only a few
    per series, so each ``"metric"`` found is classified by the byte before it and the two
    after it (0.2 s instead of 0.7 s for a 145 MB day). Occurrences are found as
    ``bytes.count`` counts them, without overlap."""
    counts = dict.fromkeys(_COUNTED, 0)
    label_after = {p[len(_METRIC):]: p for p in _METRIC_LABEL}  # ':"', ',', '}'
    i = buf.find(_METRIC)
    while i >= 0:
        counts[_METRIC] += 1
        end = i + len(_METRIC)
        after = buf[end:end + 2]
        if i > 0 and buf[i - 1:i] == b"{" and after[:1] == b":":
            counts[_DELIMITER_BYTES] += 1
            if after == b":{":
                counts[_SERIES_START] += 1
        label = label_after.get(after) or label_after.get(after[:1])
        if label is not None:
            counts[label] += 1
        i = buf.find(_METRIC, end)
    j = buf.find(_VALUES_KEY)
    while j >= 0:
        counts[_VALUES_KEY] += 1
        j = buf.find(_VALUES_KEY, j + len(_VALUES_KEY))
    return counts


def _head_and_tail(spark: SparkSession, path: str) -> tuple[bytes, bytes]:
    jvm, conf = _hadoop(spark)
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(conf)
    size = int(fs.getFileStatus(hpath).getLen())
    stream = fs.open(hpath)
    try:
        head = bytes(stream.readNBytes(_HEAD_BYTES))
        if size <= _HEAD_BYTES:
            return head, head
        stream.seek(max(size - 256, 0))
        tail = bytes(stream.readNBytes(256))
    finally:
        stream.close()
    return head, tail


def _documents_as_series(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Whole documents -> one row per series: ``source_file, doc_ok, weight, metric``
    (the label map) and ``vals`` (each sample pair's JSON text). A document that does not parse, is not ``status:
    success`` or is not a matrix continues as one marker series with one null sample
    (``doc_ok`` false, ``weight`` its lines)."""
    docs = spark.read.text(list(paths), wholetext=True).select(
        F.col("value").alias("text"), F.col("_metadata.file_path").alias("source_file")
    )
    docs = docs.select(
        "source_file", "text", F.from_json("text", QUERY_RANGE_SCHEMA).alias("doc")
    )
    doc = F.col("doc")
    docs = docs.select(
        "source_file",
        "text",
        F.coalesce(doc["data"]["result"], doc["result"]).alias("result"),
        F.coalesce(doc["data"]["resultType"], doc["resultType"]).alias("result_type"),
        doc["status"].alias("status"),
    )
    doc_ok = F.coalesce(
        (F.col("status").isNull() | (F.col("status") == "success"))
        & (F.col("result_type") == "matrix")
        & F.col("result").isNotNull(),
        F.lit(False),
    )
    # Each document is parsed once: a rejected one continues as a single marker series
    # with a single null sample, which becomes its one rejected row. Its lines are
    # counted here, before the text is dropped (a good document may be gigabytes; it is
    # never scanned for newlines).
    marker = F.array(F.lit(None).cast(_SERIES_SCHEMA))
    docs = docs.select(
        "source_file",
        doc_ok.alias("doc_ok"),
        F.when(doc_ok, F.lit(1)).otherwise(_lines("text")).alias("weight"),
        F.when(doc_ok, F.col("result")).otherwise(marker).alias("result"),
    )
    # Project the series' fields before exploding its values: exploding ``s.values`` while
    # keeping ``s`` would copy the whole series into every sample row.
    series = _explode(docs, ["source_file", "doc_ok", "weight"], "result", "s")
    return series.select(
        "source_file",
        "doc_ok",
        "weight",
        F.col("s.metric").alias("metric"),
        F.when(F.col("doc_ok"), F.col("s.values")).otherwise(_no_sample()).alias("vals"),
    )


def _explode(df: DataFrame, keep: Sequence[str], array: str, name: str) -> DataFrame:
    """``df.select(*keep, F.explode(array).alias(name))``, without the filter Spark infers
    for ``explode`` (``size(array) > 0``): the optimizer pushes it below the projections
    that build ``array`` and evaluates them again there, once per pushed copy (every
    document or series was parsed by the JSON reader three or more times; see the
    physical plan). ``posexplode_outer`` infers none, and its rows that have a position
    are exactly ``explode``'s rows."""
    out = df.select(*keep, F.posexplode_outer(array).alias("_pos", name))
    return out.where(F.col("_pos").isNotNull()).drop("_pos")


def _no_sample() -> Column:
    """The values of a rejected document or series: one null pair, its one rejected row."""
    return F.array(F.lit(None).cast(StringType()))



def _lines(text: Column | str) -> Column:
    return F.length(text) - F.length(F.replace(text, F.lit("\n"), F.lit(""))) + 1


def _records_as_series(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Files that passed :func:`reads_by_series` -> one row per series, as
    :func:`_documents_as_series`: a text read with ``{"metric":`` as the record delimiter
    (splittable, so one large document is many tasks, and no task holds a whole document),
    each record parsed on its own. The first record of a file is its header (checked on
    the driver); every other is a series without its leading ``{"metric":``, followed by
    ``,`` or by the document's closing brackets, which the JSON reader leaves unread after
    the series' own ``}``. A record that does not parse as a series is one rejected row
    (its lines)."""
    records = spark.read.option("lineSep", SERIES_DELIMITER).text(list(paths)).select(
        F.col("value").alias("rec"), F.col("_metadata.file_path").alias("source_file")
    )
    # The header is short and ends with the result's ``[`` (and blanks); a series never does.
    header = F.when(F.octet_length("rec") < _HEAD_BYTES, F.col("rec").rlike(r"\[\s*$")).otherwise(F.lit(False))
    records = records.where(~header)
    s = F.from_json(F.concat(F.lit(SERIES_DELIMITER), F.col("rec")), _SERIES_SCHEMA)
    parsed = records.select("source_file", "rec", s["metric"].alias("metric"), s["values"].alias("vals"))
    ok = F.col("metric").isNotNull() & F.col("vals").isNotNull()
    return parsed.select(
        "source_file",
        ok.alias("doc_ok"),
        F.when(ok, F.lit(1)).otherwise(_lines("rec")).alias("weight"),
        "metric",
        F.when(ok, F.col("vals")).otherwise(_no_sample()).alias("vals"),
    )


def read_query_range(spark: SparkSession, paths: Sequence[str], *, keyed: bool = False) -> DataFrame:
    """HTTP API ``query_range`` JSON (matrix), one document per file.

    A compact document (:func:`reads_by_series`, what Prometheus and ``sla export``
    write) is read series by series, in parallel; any other is parsed whole. A document
    that does not parse, is not ``status: success`` or is not a matrix is one rejected row
    standing for all its lines (a series of a compact document that does not parse: its
    lines); a sample whose value is not a number is one rejected row.
    """
    compact = {p: reads_by_series(spark, p) for p in paths}
    by_series = [p for p in paths if compact[p]]
    whole = [p for p in paths if not compact[p]]
    parts = ([_documents_as_series(spark, whole)] if whole else []) + (
        [_records_as_series(spark, by_series)] if by_series else [])
    if not parts:
        raise InputError("no query_range files")
    found = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    labels = F.col("metric")
    if keyed:
        group = labels["group"]
        label_cols = [
            F.when(group != "", group).alias("group"),
            F.coalesce(labels["broker"], F.lit("")).alias("broker"),
            F.coalesce(labels["role"], F.lit("")).alias("role"),
            F.coalesce(labels["mode"], F.lit("")).alias("mode"),
        ]
    else:
        label_cols = [F.map_filter(labels, lambda k, _v: k != "__name__").alias("labels")]
    label_names = list(KEY_LABELS) if keyed else ["labels"]
    series = found.select(
        "source_file", "doc_ok", "weight", labels["__name__"].alias("metric"), *label_cols, "vals",
    )
    samples = _explode(series, ["source_file", "doc_ok", "weight", "metric", *label_names], "vals", "pair")
    ts_text, value_text, pair_ok = _pair_parts(F.col("pair"))
    ts_s = ts_text.try_cast(DoubleType())
    parsed = samples.select(
        F.timestamp_millis(millis_of(ts_s * 1000.0)).alias("timestamp"),
        "metric",
        *label_names,
        value_text.try_cast(DoubleType()).alias("value"),
        "source_file",
        "doc_ok",
        "pair",
        pair_ok.alias("pair_ok"),
        "weight",
    )
    ok = F.col("doc_ok") & F.coalesce(
        F.col("pair_ok")
        & F.col("timestamp").isNotNull()
        & F.col("metric").isNotNull()
        & F.col("value").isNotNull(),
        F.lit(False),
    )
    # Only a rejected sample needs a printable form.
    shown = F.to_json(F.struct(*_SHOWN_LABELS)) if keyed else F.to_json("labels")
    raw = F.when(~F.col("doc_ok"), F.lit("document is not query_range matrix JSON")).when(
        ~F.col("ok"), F.concat_ws(" ", "metric", shown, "pair")
    )
    return _finish(parsed.withColumn("ok", ok).withColumn("raw", raw), keyed=keyed)


def _pair_parts(pair: Column) -> tuple[Column, Column, Column]:
    """A sample pair's JSON text ``[<seconds>,"<value>"]`` -> (seconds text, value text,
    exactly two elements?).

    The reader re-renders the pair compactly, so the common case is cut at its one comma
    by byte offsets; anything else (blanks, quoted seconds, an unquoted value) takes a
    general path that trims and unquotes both parts. String functions only.
    """
    first = F.substring_index(pair, ",", 1)
    last = F.substring_index(pair, ",", -1)
    one_comma = F.octet_length(first) + F.octet_length(last) + 1 == F.octet_length(pair)
    compact = (
        F.startswith(first, F.lit("["))
        & ~first.contains('"')
        & F.startswith(last, F.lit('"'))
        & F.endswith(last, F.lit('"]'))
    )
    fast_value = F.substring(last, F.lit(2), F.octet_length(last) - 3)  # ASCII quotes/bracket
    text = F.trim(pair)
    g_first = F.substring_index(text, ",", 1)
    g_last = F.substring_index(text, ",", -1)
    general_ok = F.startswith(text, F.lit("[")) & F.endswith(text, F.lit("]"))
    g_ts = F.btrim(F.trim(F.substring(g_first, 2, 1 << 30)), F.lit('"'))
    g_value = F.btrim(
        F.trim(F.substring(g_last, 1, F.greatest(F.length(g_last) - 1, F.lit(0)))), F.lit('"')
    )
    ts_text = F.when(compact, F.substring(first, 2, 1 << 30)).otherwise(g_ts)
    value_text = F.when(compact, fast_value).otherwise(g_value)
    two = one_comma & (compact | general_ok)
    return ts_text, value_text, two


_READERS = {
    ExportFormat.QUERY_RANGE: read_query_range,
    ExportFormat.DUMP: read_dump,
    ExportFormat.EXPOSITION: read_exposition,
}


def read_parsed(spark: SparkSession, files: Sequence[InputFile], *, keyed: bool = False) -> DataFrame:
    """Every input row with its verdict, all forms in one table: ``PARSED_COLUMNS``, or
    with ``keyed=True`` ``KEYED_COLUMNS`` (the key labels instead of the map)."""
    frames = []
    for form, reader in _READERS.items():
        paths = [f.path for f in files if f.form is form]
        if paths:
            frames.append(reader(spark, paths, keyed=keyed))
    return _union(frames)


def read_labelled(spark: SparkSession, files: Sequence[InputFile], metrics: Sequence[str]) -> DataFrame:
    """The accepted samples of ``metrics`` only, with all their labels
    (``SAMPLES_SCHEMA``): the topic pass (:mod:`understudy_spark.topics`), run only when
    the job's one pass saw such samples. Text lines that do not name one of ``metrics``
    are dropped before anything is parsed, and ``query_range`` series before their values
    are exploded, so this costs about one read of the input. Rejected rows were counted by
    the job's pass already and are left out here."""
    frames = []
    for form in ExportFormat:
        paths = [f.path for f in files if f.form is form]
        if not paths:
            continue
        if form is ExportFormat.QUERY_RANGE:
            frame = read_query_range(spark, paths)
        else:
            lines = _text_lines(spark, paths)
            named = F.lit(False)
            for metric in metrics:
                named = named | F.col("raw").contains(metric)
            parse = _parse_dump if form is ExportFormat.DUMP else _parse_exposition
            frame = _finish(parse(lines.where(named), keyed=False), keyed=False)
        frames.append(samples_of(frame.where(F.col("metric").isin(*metrics))))
    return _union(frames)


def _union(frames: Sequence[DataFrame]) -> DataFrame:
    """The frames of each input form as one table (by column name)."""
    if not frames:
        raise InputError("no input files")
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def samples_of(parsed: DataFrame) -> DataFrame:
    """The accepted rows as the normalised long table (``SAMPLES_SCHEMA``)."""
    return parsed.where(F.col("ok")).select("timestamp", "metric", "labels", "value")


def keyed_samples_of(parsed: DataFrame) -> DataFrame:
    """The accepted rows of a ``keyed=True`` read (``transforms.KEYED_SCHEMA``)."""
    return parsed.where(F.col("ok")).select("timestamp", "metric", *KEY_LABELS, "value")


def locate_first_bad(spark: SparkSession, *, path: str, form: ExportFormat) -> BadLine:
    """Find the first rejected line of one file, with its 1-based line number.

    Runs only on the error path, so it may use the driver and Python's ``json``/``re``.
    """
    if form is ExportFormat.QUERY_RANGE:
        text = spark.read.text(path, wholetext=True).first()
        body = "" if text is None else str(text[0])
        try:
            document = json.loads(body)
        except json.JSONDecodeError as exc:
            return BadLine(path, exc.lineno, f"malformed JSON: {exc.msg}")
        return BadLine(path, 1, _describe_json(document))
    # The reader's own verdict on every line, so the line shown is exactly the one the
    # job rejected; all in the JVM (no Python workers). monotonically_increasing_id is
    # <partition index> << 33 | <row in partition>, and a file's partitions are its
    # splits in order, so the line number is the lines of earlier splits + the row + 1.
    lines = spark.read.text(path).select(
        F.col("value").alias("raw"),
        F.lit(path).alias("source_file"),
        F.monotonically_increasing_id().alias("line_id"),
    )
    parse = _parse_dump if form is ExportFormat.DUMP else _parse_exposition
    first = parse(lines, keyed=True, per_line=True).where(~F.col("ok")).orderBy("line_id").select("raw", "line_id").first()
    if first is None:
        return BadLine(path, None, "no rejected line found on a second reading")
    line_id = int(first["line_id"])
    split = line_id >> 33
    before = lines.where(F.col("line_id") < F.lit(split << 33)).count() if split else 0
    what = "dump" if form is ExportFormat.DUMP else "exposition (with timestamp)"
    return BadLine(path, before + (line_id & ((1 << 33) - 1)) + 1, f"malformed {what} line: {str(first['raw'])[:120]!r}")


def _describe_json(document: object) -> str:
    if not isinstance(document, dict):
        return "not a query_range JSON object"
    if document.get("status") not in (None, "success"):
        return f"query failed: status={document.get('status')!r} error={document.get('error')!r}"
    data = document.get("data", document)
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        kind = data.get("resultType") if isinstance(data, dict) else None
        return f"resultType {kind!r} is not 'matrix' (export with /api/v1/query_range)"
    return "a sample is not [<unix seconds>, \"<number>\"] at a time between the years 1 and 9999"
