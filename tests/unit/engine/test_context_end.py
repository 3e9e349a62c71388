"""A context phase whose first sampled token ends the request, as TensorRT-LLM's executor ends it (docs/twin.md):
its end id (never output) or a stop word finishes the request at that token; its KV is freed, never sent, and its
result carries no context phase params. trtpd's layerwise transfer (its own: the handle went out before the token
was known) and a context phase that ends by its length (max_new_tokens 1: unverified upstream) keep their export."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from trtpd.engine.loader import KvTransferOptions, load_engine
from trtpd.engine.loop import EngineLoop
from trtpd.engine.request import EngineOutput, EngineRequest, RequestType

PROMPT = [5, 9, 11, 13, 17, 19, 23]
_ids = itertools.count()


@pytest.fixture(scope="module")
def prefill(fp16_root, tmp_path_factory):
    kv = KvTransferOptions(transport="tcp", key_file=tmp_path_factory.mktemp("kv") / "kv.key", timeout_ms=30000)
    loaded = load_engine(fp16_root / "prefill-tp1", kv)
    yield loaded
    loaded.close()


def context(loaded, max_new_tokens: int = 4, **fields) -> list[EngineOutput]:
    """One context-only request's outputs, until its final one."""
    rid = f"r{next(_ids)}"
    outputs: list[EngineOutput] = []
    done = threading.Event()

    def collect(out: EngineOutput) -> None:
        if out.request_id == rid:
            outputs.append(out)
            done.set() if out.finished and not fields.get("layerwise_kv_transfer") or len(outputs) == 2 else None
    loop = EngineLoop(loaded.engine, collect)
    try:
        loop.submit(EngineRequest(rid, PROMPT, max_new_tokens, RequestType.CONTEXT_ONLY, arrival_s=time.monotonic(),
                                  **fields))
        assert done.wait(60), f"{rid}: no final output"
    finally:
        loop.stop()
    return outputs


def release_all(loaded) -> None:
    """Stands in for decode: every export still held is dropped and its blocks freed."""
    for rid in list(loaded.engine.held_blocks):
        loaded.engine.exporter.fail(rid, "test done")
    loaded.engine.step()
    assert loaded.engine.stats()["used_blocks"] == 0


@pytest.fixture(scope="module")
def first_token(prefill) -> int:
    (out,) = context(prefill)
    assert out.context_phase_params and len(out.new_token_ids) == 1
    release_all(prefill)
    return out.new_token_ids[0]


def test_the_end_id_as_first_token_ends_the_request_with_no_token_no_handle_and_no_kv(prefill, first_token):
    (out,) = context(prefill, end_id=first_token)
    assert (out.finished, out.finish_reason, out.error, out.new_token_ids) == (True, "stop", None, [])
    assert out.context_phase_params is None            # nothing to pull: no handle
    assert prefill.engine.stats()["used_blocks"] == 0  # freed in the step that sampled it
    assert prefill.engine.exporter.num_pending == 0 and prefill.engine.exporter.num_pulls == 0


def test_a_stop_word_as_first_token_ends_it_too_with_the_token(prefill, first_token):
    (out,) = context(prefill, stop_words=[[first_token]])
    assert (out.finish_reason, out.new_token_ids, out.context_phase_params) == ("stop", [first_token], None)
    assert prefill.engine.stats()["used_blocks"] == 0


def test_the_layerwise_transfer_keeps_its_export_decode_ends_the_request(prefill, first_token):
    """The handle went out before the first token was known: the export completes with the end id as its first
    token, and decode, which pulls it, ends the request with none (trtpd's transfer, not TensorRT-LLM's)."""
    answered, done = context(prefill, end_id=first_token, layerwise_kv_transfer=True)
    assert answered.context_phase_params and answered.finished
    assert done.finish_reason == "stop" and done.new_token_ids == []
    assert prefill.engine.stats()["used_blocks"] > 0
    release_all(prefill)


def test_a_context_phase_that_ends_by_its_length_keeps_its_export(prefill, first_token):
    """max_new_tokens 1: what TensorRT-LLM's context server answers then is not verified; the twin exports as ever."""
    (out,) = context(prefill, max_new_tokens=1)
    assert (out.finish_reason, out.new_token_ids) == ("length", [first_token]) and out.context_phase_params
    assert prefill.engine.stats()["used_blocks"] > 0
    release_all(prefill)
