"""Reading Prometheus text (Triton's and trtpd's metrics endpoints): one parser for the gateway's load probes,
`trtpd status` and the fleet view, prometheus_client's own (label values with commas or escaped quotes included),
not a hand-split of each line."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[dict[str, str], float]


def samples(text: str, name: str) -> list[Sample]:
    """(labels, value) of every sample named `name` (a gauge's or counter's sample name as exposed)."""
    return [(dict(s.labels), float(s.value)) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


def fetch(metrics_url: str, timeout_s: float = 2.0) -> str | None:
    """The endpoint's text, or None when it does not answer."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as resp:
            return resp.read().decode()
    except OSError:
        return None
