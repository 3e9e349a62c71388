"""Prefill-side KV blocks return to their starting count after completed, cancelled and timed-out
requests; decode-side blocks after completed and cancelled ones."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from trtpd.bench.client import make_inputs
from trtpd.bench.prompts import prompt_with_tokens

pytestmark = pytest.mark.e2e


def context_only(server, tokenizer, num_tokens: int, seed: int, layerwise: bool = False):
    ids = tokenizer.encode(prompt_with_tokens(tokenizer, num_tokens, seed=seed))
    params = {"request_type": "context_only"}
    if layerwise:
        params["layerwise_kv_transfer"] = True
    return ids, server.call("prefill", {
        "input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[8]], dtype=np.int32)}, parameters=params)


def test_blocks_return_after_completed_requests(fp16_disagg, tokenizer):
    start_p, start_d = fp16_disagg.idle_blocks("prefill"), fp16_disagg.idle_blocks("decode")
    prompts = {f"r{i}": prompt_with_tokens(tokenizer, n, seed=i) for i, n in enumerate((40, 300, 900, 1500))}
    results = fp16_disagg.stream(prompts, 8)
    assert all(r.error is None and len(r.token_ids) == 8 for r in results.values())
    fp16_disagg.wait_blocks("prefill", start_p)
    fp16_disagg.wait_blocks("decode", start_d)


def test_blocks_return_after_a_cancelled_stream(fp16_disagg, tokenizer):
    start_p, start_d = fp16_disagg.idle_blocks("prefill"), fp16_disagg.idle_blocks("decode")
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(fp16_disagg.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("ensemble", make_inputs(prompt_with_tokens(tokenizer, 600, seed=7), 500),
                              request_id="to-cancel", enable_empty_final_response=True)
    for _ in range(3):   # a few tokens in, the client goes away
        result, error = got.get(timeout=60)
        assert error is None
    client.stop_stream(cancel_requests=True)
    client.close()
    fp16_disagg.wait_blocks("prefill", start_p)
    fp16_disagg.wait_blocks("decode", start_d, timeout_s=30)
    r = fp16_disagg.stream({"after": "A request after the cancellation."}, 4)["after"]
    assert r.error is None and len(r.token_ids) == 4


def test_unpulled_kv_is_freed_after_the_transfer_timeout(mismatched, tokenizer):
    start = mismatched.kv_blocks("prefill")
    _, responses = context_only(mismatched, tokenizer, 700, seed=3)
    assert responses[-1].as_numpy("context_phase_params") is not None
    # 700 tokens = 22 blocks of 32, held for a decode that never comes (waited for: the metrics lag the engine
    # by up to 0.15 s, and the transfer timeout is 1.5 s)
    mismatched.wait_blocks("prefill", start - 22, timeout_s=1.2)
    mismatched.wait_blocks("prefill", start, timeout_s=15)   # kv_transfer_timeout_ms is 1500 here


def test_blocks_return_after_cancelled_prefills(fp16_disagg, tokenizer):
    """Context-only requests cancelled while they wait or compute: their KV is freed, nothing leaks."""
    start = fp16_disagg.kv_blocks("prefill")
    client = grpcclient.InferenceServerClient(fp16_disagg.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    for i in range(4):
        ids = tokenizer.encode(prompt_with_tokens(tokenizer, 1500, seed=100 + i))
        inputs = []
        for name, value in (("input_ids", np.array([ids], dtype=np.int32)),
                            ("input_lengths", np.array([[len(ids)]], dtype=np.int32)),
                            ("request_output_len", np.array([[4]], dtype=np.int32))):
            t = grpcclient.InferInput(name, list(value.shape), "INT32")
            t.set_data_from_numpy(value)
            inputs.append(t)
        client.async_stream_infer("prefill", inputs, request_id=f"c{i}", parameters={
            "request_type": "context_only", **fp16_disagg.orchestrator_auth("context_only", [ids])})
    deadline = time.monotonic() + 10
    while fp16_disagg.kv_blocks("prefill") == start and time.monotonic() < deadline:
        time.sleep(0.01)   # until the first batch holds blocks
    client.stop_stream(cancel_requests=True)
    client.close()
    fp16_disagg.wait_blocks("prefill", start, timeout_s=20)
    r = fp16_disagg.stream({"after": "A request after the cancelled prefills."}, 4)["after"]
    assert r.error is None and len(r.token_ids) == 4


def test_a_failed_kv_pull_ends_as_tensorrt_llm_ends_a_request_its_executor_failed(fp16_disagg, tokenizer):
    """A generation request whose KV cannot be pulled (here: its export was pulled once already) ends as the
    tensorrtllm backend ends a request its executor failed (model_instance_state.cc, fillTritonResponse): INTERNAL,
    untagged, "Executor failed process requestId <id> due to the following error: ...", which the gateway reads as
    this request's failure (error_kinds.untagged_kind). The twin used to answer UNAVAILABLE with a trtpd tag."""
    from trtpd import error_kinds

    ids, responses = context_only(fp16_disagg, tokenizer, 100, seed=11)
    handle = responses[-1].as_numpy("context_phase_params")
    generation = {"input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
                  "request_output_len": np.array([[4]], dtype=np.int32), "context_phase_params": handle}
    first = fp16_disagg.call("decode", generation, parameters={"request_type": "generation_only"})
    assert sum(int(r.as_numpy("sequence_length")[0][0]) for r in first) > 0
    with pytest.raises(RuntimeError) as failed:
        fp16_disagg.call("decode", generation, parameters={"request_type": "generation_only"})
    message = str(failed.value)
    assert "Executor failed process requestId " in message and " due to the following error: " in message, message
    assert "[trtpd:" not in message and error_kinds.untagged_kind(message) == "internal"
