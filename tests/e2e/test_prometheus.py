"""The real Prometheus (Debian's 2.42, /usr/bin/prometheus) scraping a 1P+1D fleet and its gateway every 1 s:
the TTFT histogram reaches its query API, instance metrics carry instance/role labels, the alert rules load,
and every Grafana dashboard expression evaluates there. Needs the prometheus package (scripts/setup.sh):
without it this test fails, naming the missing binary."""

from __future__ import annotations

import json
import math
import time
import urllib.request

import pytest

from trtpd.fleet.gateway_process import api_key, attach_gateway
from trtpd.fleet.launcher import fleet_down, fleet_up
from trtpd.observability import prometheus as prom
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.resources import data_dir

pytestmark = pytest.mark.e2e
NAME = "obs-1p1d"


def complete(port: int, key: str, prompt: str, stream: bool = False) -> None:
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": stream}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    assert ("data: [DONE]" in text) if stream else json.loads(text)["choices"][0]["text"] is not None


def wait_for(what: str, probe, timeout_s: float = 60.0):
    """probe() until it returns something truthy; bounded, polling every 0.2 s."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except prom.TrtpdError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.2)
    raise AssertionError(f"{what}: not seen within {timeout_s:.0f} s (last answer: {last!r})")


def scalar(result: list[dict]) -> float | None:
    return float(result[0]["value"][1]) if len(result) == 1 else None


def test_prometheus_scrapes_a_fleet_and_loads_the_alerts(trtpd_home, fp16_root, tmp_path):
    binary = prom.prometheus_binary()          # fails here, naming /usr/bin/prometheus, when it is missing
    fleet = fleet_up(NAME, ReferenceDeployment(fp16_root), prefill=1, decode=1, replace=True)
    p = None
    try:
        attach_gateway(fleet)
        port = fleet.gateway["port"]
        for i in range(4):
            complete(port, api_key(fleet), f"Observability request {i}: the quick brown fox", stream=bool(i % 2))

        p = prom.start_for_fleet(fleet, tmp_path / "prometheus", scrape_interval="1s", binary=binary)
        assert p.url.startswith("http://127.0.0.1:")

        def healthy_targets():
            found = prom.api(p.url, "targets")["activeTargets"]
            return found if len(found) == 3 and all(t["health"] == "up" for t in found) else None

        targets = wait_for("3 healthy targets", healthy_targets)
        assert sorted((t["labels"]["job"], t["labels"]["instance"], t["labels"].get("role")) for t in targets) == [
            ("trtpd-gateway", "gateway", None), ("trtpd-instances", "decode-0", "decode"),
            ("trtpd-instances", "prefill-0", "prefill")]

        count = wait_for("trtpd_gateway_ttft_seconds_count", lambda: scalar(prom.query(
            p.url, "trtpd_gateway_ttft_seconds_count")))
        assert count == 4
        # traffic after the first scrapes, so rate() over the window sees the counters move
        for i in range(4):
            complete(port, api_key(fleet), f"Second wave {i}: jumps over the lazy dog", stream=bool(i % 2))

        def ttft_p99():
            v = scalar(prom.query(p.url, "histogram_quantile(0.99, sum(rate(trtpd_gateway_ttft_seconds_bucket[30s]))"
                                         " by (le))"))
            return v if v is not None and not math.isnan(v) else None

        p99 = wait_for("TTFT P99 as a number", ttft_p99)
        assert 0 < p99 < 30

        decode = wait_for("nv_trt_llm_kv_cache_block_metrics{role=decode}", lambda: prom.query(
            p.url, 'nv_trt_llm_kv_cache_block_metrics{role="decode", kv_cache_block_type="max"}'))
        assert [(s["metric"]["instance"], s["metric"]["role"], s["metric"]["job"]) for s in decode] == [
            ("decode-0", "decode", "trtpd-instances")]
        assert float(decode[0]["value"][1]) == fleet.instance("decode-0").num_kv_blocks
        # the gateway's per-instance gauges keep their own instance label (honor_labels), not exported_instance
        up = prom.query(p.url, "trtpd_instance_up")
        assert sorted((s["metric"]["instance"], s["metric"]["role"], s["value"][1]) for s in up) == [
            ("decode-0", "decode", "1"), ("prefill-0", "prefill", "1")]
        # Triton's own metrics get the target labels
        assert {s["metric"]["instance"] for s in prom.query(p.url, "nv_inference_request_success")} >= {
            "prefill-0", "decode-0"}

        groups = prom.api(p.url, "rules")["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        assert {"TrtpdTTFTP99High", "TrtpdTPOTP99High", "TrtpdGoodputLow", "TrtpdGateway5xxRate",
                "TrtpdGatewayQueueBacklog", "TrtpdInstanceDown", "TrtpdScrapeTargetDown",
                "TrtpdKVCacheNearlyFull"} == set(rules)
        assert all(r["type"] == "alerting" and r["health"] != "err" for r in rules.values()), rules
        wait_for("rules evaluated", lambda: all(r["health"] == "ok" for g in prom.api(p.url, "rules")["groups"]
                                                for r in g["rules"]))
        assert not [a for a in prom.api(p.url, "alerts")["alerts"]
                    if a["labels"]["alertname"] in ("TrtpdInstanceDown", "TrtpdScrapeTargetDown")]

        # every dashboard expression is valid PromQL here (prom.query raises on bad_data) and has series
        dashboard = json.loads((data_dir("configs") / "grafana" / "trtpd-dashboard.json").read_text())
        exprs = [(pn["title"], t["expr"]) for pn in dashboard["panels"] for t in pn.get("targets", [])]
        empty = []
        for title, expr in exprs:   # a rate() needs two scrapes that saw the counter move: poll, bounded
            concrete = expr.replace("$__rate_interval", "30s").replace("$role", ".*")
            try:
                wait_for(title, lambda q=concrete: prom.query(p.url, q), timeout_s=20.0)
            except AssertionError:
                empty.append(title)
        assert exprs and not empty, f"dashboard panels without data from a fleet that served 8 requests: {empty}"
    finally:
        try:
            if p is not None:
                prom.stop_prometheus(p)
        finally:
            fleet_down(NAME)
    from trtpd.process_identity import is_running
    assert not is_running(p.pid, p.start_time)
