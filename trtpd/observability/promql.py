"""Just enough PromQL reading to list the metric names an expression selects (the dashboard and alert tests
compare them with what the gateway and the instances export), and the names a prometheus_client registry
exposes."""

from __future__ import annotations

import re

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_:])[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?(ms|s|m|h|d|w|y)?\b")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_TEMPLATE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")


def metric_names(expr: str) -> set[str]:
    """Metric names selected by a PromQL expression (Grafana variables allowed). Function names (followed by
    a parenthesis), keywords, label names in by/without/on/ignoring lists, label matchers, strings, ranges and
    numbers are not metric names."""
    text = _STRING.sub('""', expr)
    text = _TEMPLATE.sub("1m", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        word, rest = m.group(0), text[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def exposed_names(registry) -> set[str]:
    """Every sample name a prometheus_client registry can expose, whether or not a labelled child exists yet:
    histograms name_bucket/_sum/_count, counters name_total, gauges name (plus the *_created samples)."""
    names = set()
    for family in registry.collect():
        if family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count",
                      f"{family.name}_created"}
        elif family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "summary":
            names |= {family.name, f"{family.name}_sum", f"{family.name}_count", f"{family.name}_created"}
        else:
            names.add(family.name)
    return names
