"""Bad input gets a clear error from Triton; the server stays up and serves the next request."""

from __future__ import annotations

import time

import numpy as np
import pytest

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
    start = fp16_disagg.kv_blocks("prefill")
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
    assert status == 400
    assert "KV dtype differs: prefill has fp16, decode has fp8" in answer["error"]
    assert mismatched.kv_blocks("decode", "used") == 0          # refused before any block was allocated
    assert mismatched.server.is_ready()
    # prefill held the KV for a pull that never came, and frees it at the transfer timeout
    mismatched.wait_blocks("prefill", mismatched.kv_blocks("prefill", "max"), timeout_s=15)
