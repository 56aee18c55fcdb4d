"""The Prometheus metric names that alerts, dashboards and SLA jobs may rely on.

Why this module exists: DESIGN.md's metrics contract is public — the Spark jobs, the Grafana
dashboards and the PrometheusRule all read these names. Keeping them in one place lets a test
parse every PromQL expression the chart ships and reject any name that is not listed here, so a
renamed metric breaks the build instead of silently emptying a dashboard or muting an alert.

The operator's own metrics (served on its ``/metrics``) are defined here too; the operator's
metrics module must register exactly these names.
"""

from __future__ import annotations

import re
from typing import Final

# --- DESIGN.md "Metrics contract": brokers and controllers -------------------------------
BROKER_PERMISSION: Final = "understudy_broker_permission"  # gauge {group,broker,role} 0-3
GROUP_MODE: Final = "understudy_group_mode"  # gauge {group}: 0 NORMAL .. 3 RECOVERING
GROUP_EPOCH: Final = "understudy_group_epoch"  # gauge {group}
FAILOVER_TOTAL: Final = "understudy_failover_total"  # counter {group}
FAILOVER_PHASE_SECONDS: Final = "understudy_failover_phase_seconds"  # histogram {group,phase}
MESSAGES_IN_TOTAL: Final = "understudy_messages_in_total"  # counter {group,broker}
MESSAGES_OUT_TOTAL: Final = "understudy_messages_out_total"  # counter {group,broker}
REPLICATION_LAG_BYTES: Final = "understudy_replication_lag_bytes"  # gauge {group,broker}
PRODUCE_LATENCY_SECONDS: Final = "understudy_produce_latency_seconds"  # histogram {group,broker}

# --- the operator's own metrics ------------------------------------------------------------
OPERATOR_RECONCILE_DURATION_SECONDS: Final = "understudy_operator_reconcile_duration_seconds"
"""Histogram {handler}: wall time of one kopf handler invocation."""
OPERATOR_DECISIONS_TOTAL: Final = "understudy_operator_decisions_total"
"""Counter {group,decision}: controller decisions applied (a mode transition, an override)."""
OPERATOR_ERRORS_TOTAL: Final = "understudy_operator_errors_total"
"""Counter {handler,kind}: handler failures (temporary or permanent)."""
OPERATOR_LEADING_GROUPS: Final = "understudy_operator_leading_groups"
"""Gauge: number of groups whose controller election this operator replica holds."""

# Prometheus' own series, always present for a scraped target.
UP: Final = "up"

HISTOGRAMS: Final[frozenset[str]] = frozenset(
    {FAILOVER_PHASE_SECONDS, PRODUCE_LATENCY_SECONDS, OPERATOR_RECONCILE_DURATION_SECONDS}
)
"""Histograms expose ``_bucket``, ``_sum`` and ``_count`` series instead of the bare name."""

BASE_NAMES: Final[frozenset[str]] = frozenset(
    {
        BROKER_PERMISSION,
        GROUP_MODE,
        GROUP_EPOCH,
        FAILOVER_TOTAL,
        FAILOVER_PHASE_SECONDS,
        MESSAGES_IN_TOTAL,
        MESSAGES_OUT_TOTAL,
        REPLICATION_LAG_BYTES,
        PRODUCE_LATENCY_SECONDS,
        OPERATOR_RECONCILE_DURATION_SECONDS,
        OPERATOR_DECISIONS_TOTAL,
        OPERATOR_ERRORS_TOTAL,
        OPERATOR_LEADING_GROUPS,
        UP,
    }
)


def series_names() -> frozenset[str]:
    """Every series name a PromQL expression may select: the base names, with histograms
    expanded to their ``_bucket``/``_sum``/``_count`` series (the bare histogram name is not a
    series and is therefore not included)."""
    names = set(BASE_NAMES - HISTOGRAMS)
    for hist in HISTOGRAMS:
        names.update({f"{hist}_bucket", f"{hist}_sum", f"{hist}_count"})
    return frozenset(names)


# --- finding the series names a PromQL expression selects ---------------------------------
# A deliberately small scanner, not a PromQL parser: it is used to check the expressions the
# chart ships (alerts, dashboards) against the contract above, and its tests pin what it
# recognises. It removes string literals, label matchers, range and subquery brackets,
# grouping clauses (by/on/... (labels)) and Grafana variables; what remains that is an
# identifier, not a keyword and not a function call is a series name.

_KEYWORDS: Final = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "and",
        "or",
        "unless",
        "atan2",
        "inf",
        "nan",
        "start",
        "end",
    }
)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+")
_IDENT = re.compile(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


def selected_series(expr: str) -> set[str]:
    """The series names selected by a PromQL expression (``rate(foo[5m])`` -> ``{"foo"}``).
    Selectors written only as ``{__name__="..."}`` are not recognised."""
    text = _STRING.sub('""', expr)
    text = _GRAFANA_VAR.sub("", text)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names
