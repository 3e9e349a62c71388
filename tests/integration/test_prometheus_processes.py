"""The real Prometheus and promtool binaries: the config and rules trtpd writes are accepted, the launcher starts it
on loopback and stops it by pid, and a bad config's start-up failure is reported (the config's content:
tests/unit/observability/test_prometheus_config.py)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.unit.observability.test_prometheus_config import fleet  # noqa: F401 - the fixture
from trtpd.errors import TrtpdError
from trtpd.observability import prometheus as prom
from trtpd.process_identity import is_running


def test_promtool_accepts_the_config_and_its_rules(fleet, tmp_path):
    path = prom.write_config(fleet, tmp_path / "prometheus.yml", scrape_interval="1s")
    result = subprocess.run([prom.promtool_binary(), "check", "config", str(path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout, result.stdout


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
