"""configs/grafana/trtpd-dashboard.json: loads, is wired to ${DS_PROMETHEUS}, and every PromQL expression
selects only metrics the gateway (trtpd/gateway/metrics.py's registry) or the instances (trtpd/serving/metrics.py,
TensorRT-LLM's names) export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trtpd.gateway.metrics import GatewayMetrics
from trtpd.observability.promql import exposed_names, metric_names
from trtpd.resources import data_dir

DASHBOARD = data_dir("configs") / "grafana" / "trtpd-dashboard.json"
INSTANCE_METRICS = {"nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics",
                    "nv_trt_llm_disaggregated_serving_metrics", "trtpd_batch_invariance_verified_rows"}


def instance_metric_names() -> set[str]:
    """The MetricFamily names trtpd/serving/metrics.py registers (read from its source: it imports
    triton_python_backend_utils, which exists only inside tritonserver)."""
    source = (Path(__file__).resolve().parents[3] / "trtpd" / "serving" / "metrics.py").read_text()
    return set(re.findall(r'MetricFamily\(\s*name="([^"]+)"', source))


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def exported() -> set[str]:
    return exposed_names(GatewayMetrics().registry) | instance_metric_names()


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return [p for p in out if p.get("type") != "row"]


def exprs(dashboard: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels(dashboard) for t in p.get("targets", [])]


def test_instance_metric_names_are_the_ones_the_role_models_register():
    assert instance_metric_names() == INSTANCE_METRICS


def test_metric_names_parser():
    assert metric_names('histogram_quantile(0.99, sum(rate(trtpd_gateway_ttft_seconds_bucket[$__rate_interval])) '
                        'by (le)) > 0.2') == {"trtpd_gateway_ttft_seconds_bucket"}
    assert metric_names('sum by (instance, role) (a{kind="used", role=~"$role"}) / ignoring(kind) b{x="y(z)"}') \
        == {"a", "b"}
    assert metric_names('up{job=~"trtpd-.*"} == 0 and on (instance) c_total offset 5m') == {"up", "c_total"}


def test_exposed_names_cover_every_family_of_the_gateway():
    names = exposed_names(GatewayMetrics().registry)
    for expected in ("trtpd_gateway_ttft_seconds_bucket", "trtpd_gateway_ttft_breakdown_seconds_count",
                     "trtpd_gateway_requests_total", "trtpd_gateway_kv_transfer_bytes_total",
                     "trtpd_instance_kv_blocks", "trtpd_instance_up", "trtpd_gateway_queued_requests"):
        assert expected in names
    assert "trtpd_gateway_requests" not in names and "trtpd_gateway_ttft_seconds" not in names


def test_dashboard_shape(dashboard):
    assert dashboard["schemaVersion"] == 39
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels(dashboard):
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]


def test_every_expression_selects_only_exported_metrics(dashboard, exported):
    seen = set()
    for title, expr in exprs(dashboard):
        names = metric_names(expr)
        assert names, (title, expr)
        unknown = names - exported
        assert not unknown, f"panel {title!r} selects {sorted(unknown)}, which nothing exports: {expr}"
        seen |= names
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            metric = re.match(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,", v["query"]["query"]).group(1)
            assert metric in exported, v["name"]
    # the panels the dashboard promises
    for name in ("trtpd_gateway_ttft_seconds_bucket", "trtpd_gateway_itl_seconds_bucket",
                 "trtpd_gateway_tpot_seconds_bucket", "trtpd_gateway_worst_stall_seconds_bucket",
                 "trtpd_gateway_ttft_breakdown_seconds_sum", "trtpd_gateway_kv_transfer_bytes_total",
                 "trtpd_gateway_requests_total", "trtpd_gateway_requests_slo_met_total",
                 "trtpd_gateway_requests_finished_total", "trtpd_instance_waiting", "trtpd_instance_active",
                 "trtpd_instance_kv_blocks"):
        assert name in seen, name


def test_a_misspelt_metric_would_be_caught(exported):
    assert metric_names("rate(trtpd_gateway_ttft_second_bucket[1m])") - exported == {"trtpd_gateway_ttft_second_bucket"}


def test_latency_panels_ask_for_the_promised_quantiles(dashboard):
    by_title = {p["title"]: [t["expr"] for t in p["targets"]] for p in panels(dashboard)}

    def quantiles(title):
        return sorted(float(re.match(r"histogram_quantile\(([0-9.]+),", e).group(1)) for e in by_title[title])

    assert quantiles("TTFT P50 / P90 / P99") == [0.5, 0.9, 0.99]
    assert quantiles("ITL P50 / P99") == [0.5, 0.99]
    assert quantiles("TPOT P50 / P90 / P99") == [0.5, 0.9, 0.99]
    assert 0.9 in quantiles("Worst stall P90 / P99")
    breakdown = next(p for p in panels(dashboard) if p["title"].startswith("TTFT breakdown"))
    assert breakdown["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert "by (phase)" in breakdown["targets"][0]["expr"]
