"""EOS as TensorRT-LLM handles it, through the real tritonserver (docs/twin.md):
- the role models never output the end id and do not count it (TensorRT-LLM's samplers: "Do not increase seq len
  when EOS is generated"); a streamed request that stops at it ends with an empty final response;
- the entry completes a request when its role model's stream ends, never by needing a terminal token, streaming
  and not (the old BLS failed such a request with INTERNAL "ended the request without its final token");
- the ensemble's preprocessing fills end_id from the tokenizer when the client sends none (upstream's does);
- a context phase whose first token ends the request (its end id, a stop word): the prefill model answers as the
  tensorrtllm backend does (INTERNAL, "contextParams must be present in the response") and keeps no KV; the entry
  reads that as the request's end and answers an empty completion, never asking decode.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

pytestmark = pytest.mark.e2e

PROMPT = "Tell me something about the weather today."
MAX_TOKENS = 8


def greedy(server) -> list[int]:
    status, [body] = server.generate({"text_input": PROMPT, "max_tokens": MAX_TOKENS, "end_id": -1})
    assert status == 200, body
    return body["output_ids"]


def first_new(ids: list[int], start: int = 2) -> int:
    """An index i >= start whose token does not occur before it: with end_id = ids[i] the output is ids[:i]."""
    return next(i for i in range(start, len(ids)) if ids[i] not in ids[:i])


def tokens_of(responses) -> list[int]:
    return [int(t) for r in responses if r.as_numpy("output_ids") is not None
            for t in r.as_numpy("output_ids").reshape(-1)]


@pytest.mark.parametrize("streaming", [True, False])
def test_the_role_model_never_outputs_the_end_id_and_ends_with_the_final_flag(fp16_coloc, tokenizer, streaming):
    ids = greedy(fp16_coloc)
    i = first_new(ids)
    prompt = tokenizer.encode(PROMPT)
    responses = fp16_coloc.call("colocated", {
        "input_ids": np.array([prompt], dtype=np.int32), "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
        "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
        "end_id": np.array([[ids[i]]], dtype=np.int32), "streaming": np.array([[streaming]], dtype=np.bool_)})
    assert tokens_of(responses) == ids[:i]                  # the end id is not among them
    last = responses[-1]
    assert last.get_response().parameters["triton_final_response"].bool_param
    if streaming:   # the step that sampled the end id answers with no token: the final response is empty
        assert last.as_numpy("output_ids").shape == (1, 1, 0) and last.as_numpy("sequence_length").item() == 0
        assert [r.as_numpy("sequence_length").item() for r in responses[:-1]] == [1] * i
    else:           # one response: every token, and their number
        assert len(responses) == 1 and last.as_numpy("sequence_length").item() == i


@pytest.mark.parametrize("server_name", ["fp16_disagg", "fp16_coloc"])
def test_a_request_that_stops_at_its_end_id_completes_streaming_and_not(request, tokenizer, server_name):
    server = request.getfixturevalue(server_name)
    ids = greedy(server)
    i = first_new(ids)
    body = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "end_id": ids[i]}
    status, [whole] = server.generate(body)
    assert status == 200, whole
    assert whole["output_ids"] == ids[:i] and whole["text_output"] == tokenizer.decode(ids[:i])
    status, chunks = server.generate({**body, "stream": True}, stream=True)
    assert status == 200 and all("error" not in c for c in chunks), chunks
    assert [t for c in chunks for t in np.atleast_1d(c["output_ids"]).tolist()] == ids[:i], chunks


def wait_used_blocks(server, model: str, expected: float, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (used := server.kv_blocks(model, "used")) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert used == expected, f"{model}: {used} KV blocks used after {timeout_s} s, expected {expected}"


def decode_requests(server) -> float:
    """How many requests the decode model has been sent (Triton's own counts, success or not)."""
    return sum(v for (name, labels), v in server.metrics().items()
               if name in ("nv_inference_request_success", "nv_inference_request_failure")
               and dict(labels).get("model") == "decode")


def wait_decode_requests(server, at_least: float, timeout_s: float = 10.0) -> float:
    """The decode model's request count once it reaches `at_least` (Triton counts a request as it is released,
    a moment after its last response), or what it is at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (count := decode_requests(server)) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


@pytest.mark.parametrize("ended_by", ["end_id", "stop_words_list"])
def test_a_context_phase_that_ends_at_its_first_token_answers_as_the_tensorrtllm_backend(fp16_disagg, tokenizer,
                                                                                       ended_by):
    """TensorRT-LLM's executor finishes a request whose first token is its end id or completes a stop word, frees
    its KV without sending it, and gives its result no context phase params; the tensorrtllm backend then fails the
    context-only response: INTERNAL, untagged, "Error encountered while populating response: contextParams must be
    present in the response" (model_instance_state.cc fillTritonResponse; docs/twin.md). The twin used to answer
    with a handle and keep the KV for a decode that was never needed."""
    from trtpd import error_kinds

    first = greedy(fp16_disagg)[0]
    prompt = tokenizer.encode(PROMPT)
    ends = {"end_id": np.array([[first]], dtype=np.int32)} if ended_by == "end_id" else \
        {"stop_words_list": np.array([[[first], [1]]], dtype=np.int32)}
    wait_used_blocks(fp16_disagg, "prefill", 0)
    with pytest.raises(RuntimeError) as ended:
        fp16_disagg.call("prefill", {
            "input_ids": np.array([prompt], dtype=np.int32), "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
            "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32), **ends},
            parameters={"request_type": "context_only"})
    message = str(ended.value)
    assert error_kinds.context_params_missing() in message and "[trtpd:" not in message, message
    assert error_kinds.untagged_kind(message) == "internal"
    wait_used_blocks(fp16_disagg, "prefill", 0)     # nothing is kept for decode


@pytest.mark.parametrize("kv_transfer", ["after_prefill", "layerwise"])
def test_the_first_token_at_the_end_id_gives_an_empty_completion(fp16_disagg, tokenizer, kv_transfer):
    """Prefill samples the end id: the client gets an empty completion, nothing fails.
    after_prefill (TensorRT-LLM's transfer; the entry asks for it when generation logits are wanted): the prefill
    model answers as the tensorrtllm backend does, "contextParams must be present in the response" (the test
    above), which upstream's disaggregated_serving_bls raises on, failing the request; trtpd's transport reads it as
    the request's end at its first token, so the orchestrator answers the empty completion at once, never asks
    decode, and no KV is held. layerwise (trtpd's own transfer): prefill's handle went out before the token was
    known; decode pulls the KV, and the end id, and ends the request with no token."""
    ids = greedy(fp16_disagg)
    if kv_transfer == "layerwise":
        status, [whole] = fp16_disagg.generate({"text_input": PROMPT, "max_tokens": MAX_TOKENS, "end_id": ids[0]})
        assert status == 200 and whole["output_ids"] == [], whole
        return
    prompt = tokenizer.encode(PROMPT)

    def entry(end_id: int):
        return fp16_disagg.call("disagg_bls", {
            "input_ids": np.array([prompt], dtype=np.int32),
            "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
            "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32), "end_id": np.array([[end_id]], np.int32),
            "return_generation_logits": np.array([[True]], dtype=np.bool_)})

    fp16_disagg.idle_blocks("decode")          # no decode request of an earlier test still in flight
    asked = decode_requests(fp16_disagg)
    responses = entry(ids[0])
    assert tokens_of(responses) == []
    assert responses[-1].get_response().parameters["triton_final_response"].bool_param
    wait_used_blocks(fp16_disagg, "prefill", 0)
    # the same request without the end id does reach decode: once it is counted, the count says decode got one
    # request in all, that one
    assert tokens_of(entry(-1)) == ids[:MAX_TOKENS]
    assert wait_decode_requests(fp16_disagg, asked + 1) == asked + 1


def test_preprocessing_fills_end_id_from_the_tokenizer_unless_the_client_sends_one(fp16_disagg, tokenizer):
    def end_id(extra: dict) -> int:
        tensors = {"text_input": np.array([[PROMPT.encode()]], dtype=np.object_),
                   "max_tokens": np.array([[4]], dtype=np.int32), **extra}
        (response,) = fp16_disagg.call("preprocessing", tensors)
        return int(response.as_numpy("end_id").item())

    assert end_id({}) == tokenizer.eos_id
    assert end_id({"end_id": np.array([[-1]], dtype=np.int32)}) == -1
    assert end_id({"end_id": np.array([[7]], dtype=np.int32)}) == 7
