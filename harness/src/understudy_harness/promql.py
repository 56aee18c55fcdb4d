"""Which series a PromQL expression selects: the check that keeps alerts and dashboards on
the metrics contract.

Why this module exists: the chart ships PromQL (alert rules, Grafana dashboards). A renamed
metric must break the build, not silently empty a panel, so the tests run every shipped
expression through :func:`selected_series` and compare the names with
:func:`understudy_broker.metric_names.series_names`.
"""

from __future__ import annotations

import re
from typing import Final

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
