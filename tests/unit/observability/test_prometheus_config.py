"""trtpd.observability.prometheus: the scrape config for a fleet record (checked by `promtool check config`,
which also loads the rule files) and the launcher (the real /usr/bin/prometheus on 127.0.0.1, stopped by pid)."""

from __future__ import annotations


import pytest
import yaml

from trtpd.errors import TrtpdError
from trtpd.fleet.records import FleetRecord, InstanceRecord
from trtpd.observability import prometheus as prom
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


def test_missing_binary_is_named(monkeypatch):
    monkeypatch.setattr(prom, "PROMETHEUS_BIN", "/nonexistent/prometheus-x")
    with pytest.raises(TrtpdError, match=r"/nonexistent/prometheus-x is missing.*apt-get install prometheus"):
        prom.prometheus_binary()
