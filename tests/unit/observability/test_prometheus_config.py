"""trtpd.observability.prometheus: the scrape config for a fleet record (checked by `promtool check config`,
which also loads the rule files) and the launcher (the real /usr/bin/prometheus on 127.0.0.1, stopped by pid)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import yaml

from trtpd.errors import TrtpdError
from trtpd.fleet.records import FleetRecord, InstanceRecord
from trtpd.observability import prometheus as prom
from trtpd.process_identity import is_running
from trtpd.fleet.tritonserver import ServerPorts, ServerProcess


def instance(name: str, role: str, metrics_port: int) -> InstanceRecord:
    server = ServerProcess(pid=1, host="127.0.0.1", ports=ServerPorts(metrics_port - 2, metrics_port - 1, metrics_port),
                           repo="/nonexistent", log_path="/nonexistent", shm_prefix="x")
    return InstanceRecord(name, role, role, server, "/e", "shm", "", "", [0], 8, 64, 512, 1024)


@pytest.fixture
def fleet() -> FleetRecord:
    return FleetRecord("obs-unit", "disaggregated", "/b", "/k", "/t",
                       [instance("prefill-0", "prefill", 40002), instance("decode-0", "decode", 40012)],
                       gateway={"pid": 1, "start_time": 0, "host": "127.0.0.1", "port": 40100})


def test_config_scrapes_the_gateway_and_every_instance_with_instance_and_role_labels(fleet):
    config = yaml.safe_load(prom.render_config(fleet, scrape_interval="1s"))
    assert config["global"]["scrape_interval"] == "1s" and config["global"]["evaluation_interval"] == "1s"
    assert config["rule_files"] == [str(prom.alerts_file().resolve())]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"trtpd-gateway", "trtpd-instances"}
    gw = jobs["trtpd-gateway"]
    assert gw["metrics_path"] == "/metrics" and gw["honor_labels"] is True
    assert gw["static_configs"] == [{"targets": ["127.0.0.1:40100"], "labels": {"instance": "gateway",
                                                                               "fleet": "obs-unit"}}]
    inst = jobs["trtpd-instances"]
    assert inst["metrics_path"] == "/metrics" and inst["honor_labels"] is True
    assert inst["static_configs"] == [
        {"targets": ["127.0.0.1:40002"], "labels": {"instance": "prefill-0", "role": "prefill", "fleet": "obs-unit"}},
        {"targets": ["127.0.0.1:40012"], "labels": {"instance": "decode-0", "role": "decode", "fleet": "obs-unit"}}]


def test_default_interval_and_bad_durations(fleet):
    assert yaml.safe_load(prom.render_config(fleet))["global"]["scrape_interval"] == "5s"
    with pytest.raises(TrtpdError, match="scrape_interval"):
        prom.render_config(fleet, scrape_interval="1 second")


def test_no_gateway_yet_scrapes_the_instances_only(fleet):
    fleet.gateway = None
    jobs = [j["job_name"] for j in yaml.safe_load(prom.render_config(fleet))["scrape_configs"]]
    assert jobs == ["trtpd-instances"]


def test_promtool_accepts_the_config_and_its_rules(fleet, tmp_path):
    path = prom.write_config(fleet, tmp_path / "prometheus.yml", scrape_interval="1s")
    result = subprocess.run([prom.promtool_binary(), "check", "config", str(path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout, result.stdout


def test_missing_binary_is_named(monkeypatch):
    monkeypatch.setattr(prom, "PROMETHEUS_BIN", "/nonexistent/prometheus-x")
    with pytest.raises(TrtpdError, match=r"/nonexistent/prometheus-x is missing.*apt-get install prometheus"):
        prom.prometheus_binary()


def test_launcher_starts_on_loopback_loads_the_rules_and_stops_by_pid(fleet, tmp_path):
    """The real binary: ready, on 127.0.0.1, rules loaded, targets known (down: nothing listens there), stopped."""
    p = prom.start_for_fleet(fleet, tmp_path, scrape_interval="1s", timeout_s=60)
    try:
        assert p.host == "127.0.0.1" and p.port > 0 and is_running(p.pid, p.start_time)
        assert os.path.realpath(f"/proc/{p.pid}/exe") == os.path.realpath(prom.prometheus_binary())
        rules = {r["name"] for g in prom.api(p.url, "rules")["groups"] for r in g["rules"]}
        assert {"TrtpdTTFTP99High", "TrtpdInstanceDown", "TrtpdKVCacheNearlyFull"} <= rules
        deadline = time.monotonic() + 20
        while not (targets := prom.api(p.url, "targets")["activeTargets"]) and time.monotonic() < deadline:
            time.sleep(0.1)      # the scrape manager picks the targets up shortly after /-/ready
        assert sorted(t["labels"]["instance"] for t in targets) == ["decode-0", "gateway", "prefill-0"]
        assert prom.query(p.url, "vector(1)")[0]["value"][1] == "1"
        with pytest.raises(TrtpdError, match="bad_data"):
            prom.query(p.url, "sum(")
    finally:
        prom.stop_prometheus(p)
    assert not is_running(p.pid, p.start_time)
    prom.stop_prometheus(p)     # a second stop is a no-op


def test_start_failure_reports_the_log(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("global: {scrape_interval: nonsense}\n")
    with pytest.raises(TrtpdError, match="exited during start-up"):
        prom.start_prometheus(bad, tmp_path, timeout_s=30)
