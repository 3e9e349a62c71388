"""Triton stays a first-class entry in the fleet: a Triton server holding the same ensemble,
pre/post-processing and orchestrator, whose orchestrator routes across the fleet's instances through the
routing core (as the gateway does). Triton clients of `ensemble` get the single server's greedy tokens."""

from __future__ import annotations

import pytest

from trtpd.bench.client import BenchRequest, run_stream
from trtpd.bench.prompts import prompt_with_tokens
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.fleet.launcher import fleet_down, fleet_up

pytestmark = pytest.mark.e2e

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def entry_fleet(trtpd_home, fp16_root):
    fleet = fleet_up("entry-2p1d", ReferenceDeployment(fp16_root), prefill=2, decode=1, triton_entry=True,
                     replace=True)
    try:
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
    served = {}
    import urllib.request
    for inst in entry_fleet.instances:
        if inst.role == "prefill":
            text = urllib.request.urlopen(inst.metrics_url, timeout=5).read().decode()
            served[inst.name] = next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                     if line.startswith("nv_trt_llm_request_metrics{")
                                     and 'request_type="completed"' in line)
    assert all(count > 0 for count in served.values()), served     # both prefill instances served
