"""configs/prometheus/alerts.yml: valid for Prometheus 2.42 (`promtool check rules`), its PromQL behaves as
configs/prometheus/alerts_test.yml says (`promtool test rules`: the TTFT P99 alert fires / does not fire on
synthetic series), and it selects only metrics that exist. Needs Debian's prometheus package (promtool):
without it these tests fail, naming the missing binary."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from trtpd.gateway.metrics import GatewayMetrics
from trtpd.observability.prometheus import alerts_file, promtool_binary
from trtpd.observability.promql import exposed_names, metric_names

PROMETHEUS_SYNTHETIC = {"up"}     # written by Prometheus itself for every scrape target
SEED_000_TTFT = "histogram_quantile(0.99, sum(rate(trtpd_gateway_ttft_seconds_bucket[1m])) by (le)) > 0.2"


def promtool(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool_binary(), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.fixture(scope="module")
def rules() -> dict[str, dict]:
    doc = yaml.safe_load(alerts_file().read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def test_promtool_check_rules():
    result = promtool("check", "rules", str(alerts_file()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout, result.stdout


def test_promtool_test_rules():
    result = promtool("test", "rules", str(alerts_file().with_name("alerts_test.yml")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_unit_tests_can_fail(tmp_path):
    """A TTFT threshold of 300 ms would make the 'P99 = 299 ms fires' case fail: the tests check the PromQL."""
    shutil.copy(alerts_file().with_name("alerts_test.yml"), tmp_path / "alerts_test.yml")
    text = alerts_file().read_text()
    assert SEED_000_TTFT in text
    (tmp_path / "alerts.yml").write_text(text.replace(SEED_000_TTFT, SEED_000_TTFT[:-3] + "0.3"))
    result = promtool("test", "rules", str(tmp_path / "alerts_test.yml"))
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "alertname: TrtpdTTFTP99High, time: 5m" in out, out


def test_seed_000_ttft_alert(rules):
    rule = rules["TrtpdTTFTP99High"]
    assert rule["expr"] == SEED_000_TTFT
    assert rule["for"] == "2m" and rule["labels"]["severity"]


def test_the_promised_alerts_exist(rules):
    assert {"TrtpdTTFTP99High", "TrtpdInstanceDown", "TrtpdKVCacheNearlyFull", "TrtpdGoodputLow",
            "TrtpdGateway5xxRate"} <= set(rules)
    assert "trtpd_instance_up == 0" in rules["TrtpdInstanceDown"]["expr"]
    assert "trtpd_instance_kv_blocks" in rules["TrtpdKVCacheNearlyFull"]["expr"]
    assert {"trtpd_gateway_requests_slo_met_total", "trtpd_gateway_requests_finished_total"} <= \
        metric_names(rules["TrtpdGoodputLow"]["expr"])
    assert 'status=~"5.."' in rules["TrtpdGateway5xxRate"]["expr"]


def test_alerts_select_only_exported_metrics(rules):
    exported = exposed_names(GatewayMetrics().registry) | PROMETHEUS_SYNTHETIC
    for name, rule in rules.items():
        names = metric_names(rule["expr"])
        assert names and not names - exported, (name, sorted(names - exported))
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), name
        assert rule["annotations"]["summary"], name
