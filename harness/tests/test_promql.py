"""The PromQL series-name scanner used to hold alerts and dashboards to the metrics contract."""

from __future__ import annotations

import pytest

from understudy_broker.metric_names import BASE_NAMES, HISTOGRAMS, series_names
from understudy_harness.promql import selected_series


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('absent(up{job="a,b"} == 1)', {"up"}),
        ("rate(foo_total[5m])", {"foo_total"}),
        ("sum by (group, le) (rate(x_bucket{a=~\"$g\"}[$__rate_interval]))", {"x_bucket"}),
        ("a / on (group) group_left (broker) b", {"a", "b"}),
        ("max without (instance) (a) unless ignoring (x) b", {"a", "b"}),
        ("avg_over_time((sum by (g) (m % 2) > bool 0)[24h:1m]) * 1e3", {"m"}),
        ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m] offset 1h)))", {"h_bucket"}),
        ('label_replace(m, "dst", "$1", "src", "(.*)")', {"m"}),
        ("m{job=\"x\"} and n{l='y'} or o", {"m", "n", "o"}),
        ("vector(1)", set()),
        ("ns:rule:rate5m", {"ns:rule:rate5m"}),
        ("m{a=\"{weird}\"}", {"m"}),
        ("${ds_var} + m", {"m"}),
    ],
)
def test_selected_series(expr: str, names: set[str]) -> None:
    assert selected_series(expr) == names


def test_series_names_expand_histograms() -> None:
    names = series_names()
    for hist in HISTOGRAMS:
        assert hist not in names
        assert {f"{hist}_bucket", f"{hist}_sum", f"{hist}_count"} <= names
    assert "understudy_broker_permission" in names
    assert "up" in names
    assert len(names) == len(BASE_NAMES) - len(HISTOGRAMS) + 3 * len(HISTOGRAMS)
