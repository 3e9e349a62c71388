"""EOS as TensorRT-LLM handles it, through the real tritonserver (docs/twin.md):
- the role models never output the end id and do not count it (TensorRT-LLM's samplers: "Do not increase seq len
  when EOS is generated"); a streamed request that stops at it ends with an empty final response;
- the entry completes a request when its role model's stream ends, never by needing a terminal token, streaming
  and not (the old BLS failed such a request with INTERNAL "ended the request without its final token");
- the ensemble's preprocessing fills end_id from the tokenizer when the client sends none (upstream's does).
"""

from __future__ import annotations

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


def test_the_first_token_at_the_end_id_gives_an_empty_completion(fp16_disagg):
    """Prefill samples the end id (the after-prefill transfer's first token): nothing is output, nothing fails."""
    ids = greedy(fp16_disagg)
    status, [whole] = fp16_disagg.generate({"text_input": PROMPT, "max_tokens": MAX_TOKENS, "end_id": ids[0]})
    assert status == 200 and whole["output_ids"] == [], whole


def test_preprocessing_fills_end_id_from_the_tokenizer_unless_the_client_sends_one(fp16_disagg, tokenizer):
    def end_id(extra: dict) -> int:
        tensors = {"text_input": np.array([[PROMPT.encode()]], dtype=np.object_),
                   "max_tokens": np.array([[4]], dtype=np.int32), **extra}
        (response,) = fp16_disagg.call("preprocessing", tensors)
        return int(response.as_numpy("end_id").item())

    assert end_id({}) == tokenizer.eos_id
    assert end_id({"end_id": np.array([[-1]], dtype=np.int32)}) == -1
    assert end_id({"end_id": np.array([[7]], dtype=np.int32)}) == 7
