"""Readers: format detection, each export form, and bad input (error names file and
line; ``--skip-bad`` counts what it rejected)."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
from typing import Any

import pytest

from understudy_spark import job, readers
from understudy_spark.readers import ExportFormat, InputError, detect_format

T_MS = 1793534400000  # 2026-11-01T12:00:00Z
PERM = 'understudy_broker_permission{group="g", broker="g-0", role="master"}'


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
