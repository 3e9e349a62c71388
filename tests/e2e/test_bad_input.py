"""Bad input gets a clear error from Triton; the server stays up and serves the next request."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from trtpd.bench.prompts import prompt_with_tokens

pytestmark = pytest.mark.e2e


def still_serves(server) -> None:
    status, [body] = server.generate({"text_input": "And the next request works.", "max_tokens": 3, "end_id": -1})
    assert status == 200 and len(body["output_ids"]) == 3, body


def error_of(server, body: dict) -> str:
    status, [answer] = server.generate(body)
    assert status == 400, (status, answer)
    return answer["error"]


@pytest.mark.parametrize("body, message", [
    ({"text_input": "", "max_tokens": 8}, "text_input is empty"),
    ({"text_input": "hello", "max_tokens": 0}, "max_tokens must be between 1 and 512, got 0"),
    ({"text_input": "hello", "max_tokens": -3}, "max_tokens must be between 1 and 512, got -3"),
    ({"text_input": "hello", "max_tokens": 100000}, "max_tokens must be between 1 and 512, got 100000"),
])
def test_invalid_requests_over_http(fp16_disagg, body, message):
    assert message in error_of(fp16_disagg, body)
    still_serves(fp16_disagg)


def test_prompt_above_the_maximum_input_length(fp16_disagg, tokenizer):
    text = prompt_with_tokens(tokenizer, 2100, seed=1)
    error = error_of(fp16_disagg, {"text_input": text, "max_tokens": 4})
    assert "prompt is 2100 tokens, above the maximum input length 2048" in error
    still_serves(fp16_disagg)


def test_bytes_that_are_not_utf8(fp16_disagg):
    with pytest.raises(RuntimeError, match="not valid UTF-8"):
        fp16_disagg.call("ensemble", {"text_input": np.array([[b"caf\xe9 \xff\xfe"]], dtype=np.object_),
                                      "max_tokens": np.array([[4]], dtype=np.int32)})
    still_serves(fp16_disagg)


def _decode_with(server, ids, blob: bytes):
    return server.call("decode", {
        "input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[4]], dtype=np.int32),
        "context_phase_params": np.frombuffer(blob, dtype=np.uint8).reshape(1, -1)},
        parameters={"request_type": "generation_only"})


def _real_handle(server, tokenizer, n=100):
    ids = tokenizer.encode(prompt_with_tokens(tokenizer, n, seed=n))
    responses = server.call("prefill", {
        "input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[4]], dtype=np.int32)}, parameters={"request_type": "context_only"})
    return ids, responses[-1].as_numpy("context_phase_params").reshape(-1).tobytes()


def test_forged_context_phase_params_are_refused(fp16_disagg, tokenizer):
    ids = tokenizer.encode("Some prompt")
    with pytest.raises(RuntimeError, match="malformed|not a trtpd"):
        _decode_with(fp16_disagg, ids, b"not a handle at all, just bytes")
    start = fp16_disagg.idle_blocks("prefill")
    ids, handle = _real_handle(fp16_disagg, tokenizer)
    tampered = bytearray(handle)
    tampered[-5] ^= 0x01   # flip one bit of the signed payload
    with pytest.raises(RuntimeError, match="signature"):
        _decode_with(fp16_disagg, ids, bytes(tampered))
    out = _decode_with(fp16_disagg, ids, handle)   # the genuine handle still works, then frees the blocks
    assert sum(r.as_numpy("output_ids").size for r in out if r.as_numpy("output_ids") is not None) == 4
    fp16_disagg.wait_blocks("prefill", start)
    still_serves(fp16_disagg)


def test_stale_handle_is_refused(mismatched, tokenizer):
    ids, handle = _real_handle(mismatched, tokenizer)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:   # wait out kv_transfer_timeout_ms (1500 ms) of this deployment
        try:
            _decode_with(mismatched, ids, handle)
        except RuntimeError as exc:
            if "expired" in str(exc):
                return
            if "dtype" not in str(exc):
                raise
        time.sleep(0.25)
    pytest.fail("a handle past its expiry was not refused as expired")


def test_request_type_must_match_the_role(fp16_disagg, tokenizer):
    ids = tokenizer.encode("Some prompt")
    with pytest.raises(RuntimeError, match="prefill \\(context-only\\) instance"):
        fp16_disagg.call("prefill", {"input_ids": np.array([ids], dtype=np.int32),
                                     "input_lengths": np.array([[len(ids)]], dtype=np.int32),
                                     "request_output_len": np.array([[4]], dtype=np.int32)})
    still_serves(fp16_disagg)


def test_kv_layout_mismatch_fails_the_request_clearly(mismatched):
    status, [answer] = mismatched.generate({"text_input": "A prompt for mismatched engines.", "max_tokens": 4})
    # The orchestrator sends INTERNAL (the deployment's fault), but Triton 2.51's HTTP generate answers 400 for
    # every error code a decoupled python model sends (probed: UNKNOWN..ALREADY_EXISTS all give 400)
    assert status == 400
    assert "KV dtype differs: prefill has fp16, decode has fp8" in answer["error"]
    assert mismatched.kv_blocks("decode", "used") == 0          # refused before any block was allocated
    assert mismatched.server.is_ready()
    # prefill held the KV for a pull that never came, and frees it at the transfer timeout
    mismatched.wait_blocks("prefill", mismatched.kv_blocks("prefill", "max"), timeout_s=15)


# ---- the bad-input corpus: the same verdict over HTTP generate and gRPC streaming ------------------------

GOOD = {"text_input": "A prompt that is fine.", "max_tokens": 4}
GRPC_TYPES = {"text_input": "BYTES", "stop_words": "BYTES", "bad_words": "BYTES", "stream": "BOOL",
              "exclude_input_in_output": "BOOL", "return_log_probs": "BOOL", "temperature": "FP32",
              "top_p": "FP32", "repetition_penalty": "FP32", "seed": "UINT64", "random_seed": "UINT64"}

# (extra fields, the field the error must name); every case is the client's fault
CLIENT_FAULTS = [
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 10**6}, "top_k"),
    ({"end_id": 10**6}, "end_id"),
    ({"pad_id": -7}, "pad_id"),
    ({"min_length": -2}, "min_length"),
    ({"beam_width": 2}, "beam_width"),
    ({"repetition_penalty": 1.3}, "repetition_penalty"),
    ({"return_log_probs": True}, "return_log_probs"),
    ({"seed": 1, "random_seed": 2}, "random_seed"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"tempurature": 0.5}, "tempurature"),          # misspelt: unknown over both protocols
    ({"prompt_vocab_size": 3}, "prompt_vocab_size"),  # a TensorRT-LLM input this ensemble lacks
]


def grpc_error(server, body: dict, model: str = "ensemble", timeout_s: float = 60.0):
    """Sends body on the gRPC stream; returns the error (or None once the final response came)."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    inputs = []
    for name, value in body.items():
        dtype = GRPC_TYPES.get(name, "INT32")
        np_type = {"BYTES": np.object_, "BOOL": np.bool_, "FP32": np.float32, "UINT64": np.uint64}.get(dtype, np.int32)
        arr = np.array([[value.encode() if isinstance(value, str) else value]], dtype=np_type)
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result, error = answers.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                return error
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return None
        raise TimeoutError(f"no final response in {timeout_s} s")
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


@pytest.mark.parametrize("extra, field", CLIENT_FAULTS, ids=[f for _, f in CLIENT_FAULTS])
def test_client_faults_are_400_over_http_and_refused_over_grpc_naming_the_field(fp16_disagg, extra, field):
    status, [answer] = fp16_disagg.generate({**GOOD, **extra})
    assert status == 400 and field in answer["error"], (status, answer)
    error = grpc_error(fp16_disagg, {**GOOD, **extra})
    assert error is not None and field in str(error), error
    # a stream carries no status code per response (ModelStreamInferResponse has error_message only), and
    # the ensemble is decoupled, so unary ModelInfer (which would carry one) is refused as UNIMPLEMENTED
    still_serves(fp16_disagg)


def test_nan_temperature_over_grpc_is_refused_and_the_server_serves_on(fp16_coloc):
    error = grpc_error(fp16_coloc, {**GOOD, "temperature": float("nan")})
    assert error is not None and "temperature must be a finite number >= 0, got nan" in str(error)
    still_serves(fp16_coloc)


def test_tiny_temperature_works_like_greedy(fp16_coloc):
    status, [greedy] = fp16_coloc.generate({**GOOD, "end_id": -1})
    status_tiny, [tiny] = fp16_coloc.generate({**GOOD, "end_id": -1, "temperature": 1e-40, "random_seed": 5})
    assert status == status_tiny == 200 and tiny["output_ids"] == greedy["output_ids"], tiny


def test_stream_true_on_generate_is_triton_s_own_answer(fp16_disagg):
    """A model cannot tell generate from generate_stream; Triton 2.51 answers a streamed request on generate
    with 200 and its own error body. Documented in the ensemble; generate_stream streams it."""
    status, [answer] = fp16_disagg.generate({**GOOD, "stream": True})
    assert "use generate stream" in answer.get("error", ""), (status, answer)
    status, chunks = fp16_disagg.generate({**GOOD, "stream": True, "end_id": -1}, stream=True)
    assert status == 200 and len(chunks) == 4 and all("text_output" in c for c in chunks), chunks


# ---- TensorRT-LLM ensemble inputs that work ----------------------------------------------------------------

def baseline(server, text="Tell me something about the weather today.", n=8):
    status, [body] = server.generate({"text_input": text, "max_tokens": n, "end_id": -1})
    assert status == 200, body
    return text, body["output_ids"]


def single_token_word(tokenizer, ids, start=1):
    """(index, text) of a generated token whose text tokenizes back to exactly that token."""
    for i in range(start, len(ids)):
        word = tokenizer.decode([ids[i]])
        if word and tokenizer.encode(word, add_bos=False) == [ids[i]] and ids[i] not in ids[:i]:
            return i, word
    pytest.fail(f"no generated token of {ids} round-trips through the tokenizer")


@pytest.mark.parametrize("server_name", ["fp16_disagg", "fp16_coloc"])
def test_stop_words_end_the_output(request, tokenizer, server_name):
    server = request.getfixturevalue(server_name)
    text, ids = baseline(server)
    i, word = single_token_word(tokenizer, ids)
    status, [body] = server.generate({"text_input": text, "max_tokens": 8, "end_id": -1, "stop_words": [word]})
    assert status == 200 and body["output_ids"] == ids[:i + 1], (ids, i, body)


def test_bad_words_are_never_generated(fp16_disagg, tokenizer):
    text, ids = baseline(fp16_disagg)
    i, word = single_token_word(tokenizer, ids, start=0)
    status, [body] = fp16_disagg.generate({"text_input": text, "max_tokens": 8, "end_id": -1, "bad_words": [word]})
    assert status == 200 and ids[i] not in body["output_ids"] and body["output_ids"][:i] == ids[:i], (ids, body)


def test_exclude_input_in_output(fp16_disagg):
    """true (trtpd's behaviour: the completion only) works; false is refused by name (see text_models.py)."""
    text, _ = baseline(fp16_disagg)
    _, [only] = fp16_disagg.generate({"text_input": text, "max_tokens": 8, "end_id": -1})
    _, [excluded] = fp16_disagg.generate({"text_input": text, "max_tokens": 8, "end_id": -1,
                                          "exclude_input_in_output": True})
    assert excluded["text_output"] == only["text_output"] and not excluded["text_output"].startswith(text)
    status, [answer] = fp16_disagg.generate({"text_input": text, "max_tokens": 8, "exclude_input_in_output": False})
    assert status == 400 and "exclude_input_in_output=False is not supported" in answer["error"], answer


def test_min_length_holds_back_end_id(fp16_coloc):
    text, ids = baseline(fp16_coloc)
    _, [short] = fp16_coloc.generate({"text_input": text, "max_tokens": 8, "end_id": ids[1]})
    # the end id itself is never output (TensorRT-LLM's samplers); HTTP generate gives one id as a scalar
    assert np.atleast_1d(short["output_ids"]).tolist() == ids[:1], short
    _, [held] = fp16_coloc.generate({"text_input": text, "max_tokens": 8, "end_id": ids[1], "min_length": 5})
    assert len(held["output_ids"]) >= 5 and held["output_ids"][:1] == ids[:1], held


def test_genai_perf_default_payload_is_served(fp16_disagg):
    """genai-perf's payload for Triton's tensorrtllm ensemble: text_input, max_tokens, stream (and min_length
    when the output length is deterministic)."""
    status, [body] = fp16_disagg.generate({"text_input": "Hello", "max_tokens": 5, "stream": False,
                                           "min_length": 5})
    assert status == 200 and len(body["output_ids"]) == 5, body
    status, chunks = fp16_disagg.generate({"text_input": "Hello", "max_tokens": 5, "stream": True}, stream=True)
    assert status == 200 and chunks and all("error" not in c for c in chunks), chunks
