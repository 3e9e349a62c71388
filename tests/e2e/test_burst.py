"""Bursts queue, they do not fail: 400 requests sent at once on one gRPC stream to the disaggregated
deployment all complete (the orchestrator's admission keeps its sub-requests below the python
backend's thread pool), none expires, and every KV block returns."""

import time

from trtpd.bench.client import BenchRequest, run_stream
from trtpd.bench.prompts import prompt_with_tokens

NUM_REQUESTS = 400


def test_400_requests_at_once_all_complete_and_kv_returns_to_baseline(fp16_disagg, tokenizer):
    """120-220-token prompts: together about twice what prefill's KV pool holds, so prefill sub-requests
    must wait for blocks that only decode's pulls free (the shape of the original collapse)."""
    # idle means every block free (a just-finished request of an earlier test may still show in the metrics)
    base_prefill, base_decode = fp16_disagg.idle_blocks("prefill"), fp16_disagg.idle_blocks("decode")
    reqs = [BenchRequest(f"burst-{i}", prompt_with_tokens(tokenizer, 120 + i % 101, seed=i), 6, 0.0)
            for i in range(NUM_REQUESTS)]
    started = time.perf_counter()
    results = run_stream(fp16_disagg.grpc_url, reqs, timeout_s=400.0)
    elapsed_s = time.perf_counter() - started
    errors = [r.error for r in results if r.error]
    overloaded = [e for e in errors if "overloaded" in e]
    print(f"burst of {NUM_REQUESTS}: {NUM_REQUESTS - len(errors)} completed, {len(overloaded)} refused as "
          f"overloaded, {len(errors) - len(overloaded)} other errors, {elapsed_s:.1f} s")
    assert not [e for e in errors if "overloaded" not in e], errors[:3]
    assert all(len(r.token_ids) == 6 for r in results if not r.error)
    # the same prompt alone gives the same tokens as inside the burst
    alone = run_stream(fp16_disagg.grpc_url, [BenchRequest("alone", reqs[123].prompt, 6, 0.0)])[0]
    assert alone.token_ids == results[123].token_ids
    fp16_disagg.wait_blocks("prefill", base_prefill)
    fp16_disagg.wait_blocks("decode", base_decode)
