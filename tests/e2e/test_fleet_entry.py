"""Triton stays a first-class entry in the fleet: a Triton server holding the same ensemble and
pre/post-processing, whose BLS sends each request to the fleet's gateway, which admits, routes, measures and
samples it as it does OpenAI clients' requests. Triton clients of `ensemble` get the single server's greedy
tokens, and the controller's view (the gateway's samples and metrics) counts them."""

from __future__ import annotations

import json
import urllib.request

import pytest

from trtpd.bench.client import BenchRequest, run_stream
from trtpd.bench.prompts import prompt_with_tokens
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.fleet.gateway_process import attach_gateway
from trtpd.fleet.launcher import fleet_down, fleet_up
from trtpd.kv.auth import gateway_admin_token
from trtpd.kv.handle import load_or_create_key_file
from trtpd.gateway.api_keys import read_api_keys
from trtpd.metrics_text import samples

pytestmark = pytest.mark.e2e

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def entry_fleet(trtpd_home, fp16_root):
    fleet = fleet_up("entry-2p1d", ReferenceDeployment(fp16_root), prefill=2, decode=1, triton_entry=True,
                     replace=True)
    try:
        attach_gateway(fleet)
        yield fleet
    finally:
        fleet_down("entry-2p1d")


def test_ensemble_clients_are_routed_across_the_fleet_and_get_the_single_servers_tokens(
        entry_fleet, fp16_disagg, tokenizer):
    entry = entry_fleet.instance("entry")
    assert entry.role == "entry" and entry.model == "ensemble"
    prompts = {f"p{n}": prompt_with_tokens(tokenizer, n, seed=900 + n) for n in (3, 40, 300, 900)}
    reqs = [BenchRequest(rid, text, MAX_TOKENS, 0.0) for rid, text in prompts.items()] * 2
    reqs = [BenchRequest(f"{r.request_id}-{i}", r.prompt, r.max_tokens, 0.0) for i, r in enumerate(reqs)]
    via_fleet = {r.request_id: r for r in run_stream(entry.grpc_url, reqs, timeout_s=120)}
    single = {r.request_id: r for r in run_stream(fp16_disagg.grpc_url, reqs, timeout_s=120)}
    for rid, result in via_fleet.items():
        assert result.error is None, (rid, result.error)
        assert result.token_ids == single[rid].token_ids and len(result.token_ids) == MAX_TOKENS, rid
        assert result.perf.get("kv_transfer_bytes", 0) > 0          # the KV really moved between instances
    # the gateway served them: its samples (the rollout gate's and the autoscaler's input) and its counter
    g = entry_fleet.gateway
    admin = {"Authorization": f"Bearer {gateway_admin_token(load_or_create_key_file(entry_fleet.key_file))}"}
    with urllib.request.urlopen(urllib.request.Request(f"http://{g['host']}:{g['port']}/admin/requests",
                                                       headers=admin), timeout=10) as resp:
        finished = json.loads(resp.read())["requests"]
    assert len(finished) == len(reqs) and all(s["ok"] and s["num_tokens"] == MAX_TOKENS for s in finished), finished
    assert all(s["ttft_s"] > 0 and s["decode_instance"] == "decode-0" for s in finished)
    api_key = sorted(read_api_keys(g["api_key_file"]))[0]
    with urllib.request.urlopen(urllib.request.Request(f"http://{g['host']}:{g['port']}/metrics", headers={
            "Authorization": f"Bearer {api_key}"}), timeout=10) as resp:
        counted = samples(resp.read().decode(), "trtpd_gateway_requests_total")
    assert [v for labels, v in counted if labels == {"endpoint": "/admin/generate", "status": "200"}] == [len(reqs)]
    served = {}
    for inst in entry_fleet.instances:
        if inst.role == "prefill":
            text = urllib.request.urlopen(inst.metrics_url, timeout=5).read().decode()
            served[inst.name] = next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                     if line.startswith("nv_trt_llm_request_metrics{")
                                     and 'request_type="completed"' in line)
    assert all(count > 0 for count in served.values()), served     # both prefill instances served
