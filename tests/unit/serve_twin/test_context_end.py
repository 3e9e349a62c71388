"""The twin's context answer when the first token ended the request, as trtllm-serve's PyTorch path gives it
(docs/serve-twin.md): TorchSampler finishes the request (END_ID, STOP_WORDS), py_executor sends no KV
(_send_disagg_ctx_cache sends only a request whose context finished, or one finished by its length), and
executor/result.py answers with the request's own disaggregated_params (context_only, the rest null) and
finish_reason "stop". The twin used to export the KV and answer a ctx_request_id and opaque state for it."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from trtpd.engine.engine_config import Role
from trtpd.engine.loader import KvTransferOptions, load_engine
from trtpd.serve_twin.app import TwinWorker, create_app
from trtpd.serve_twin.engine_bridge import AsyncEngine

PROMPT = [1, 450, 496, 173, 170, 432, 1204, 975, 278]


@pytest.fixture(scope="module")
def worker(fp16_root, tmp_path_factory):
    kv = KvTransferOptions(transport="tcp", key_file=tmp_path_factory.mktemp("kv") / "kv.key", timeout_ms=30000)
    engine = AsyncEngine(load_engine(fp16_root / "prefill-tp1", kv, Role.PREFILL), name="twin-prefill")
    yield TwinWorker(engine, "tiny-llama", "prefill", None)
    engine.close()


def _context(worker, **fields) -> dict:
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "detokenize": False,
            "disaggregated_params": {"request_type": "context_only"}, **fields}

    async def post():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(worker)),
                                     base_url="http://twin") as client:
            return await client.post("/v1/completions", json=body)
    r = asyncio.run(post())
    assert r.status_code == 200, r.text
    return r.json()


def test_a_context_phase_that_ended_the_request_answers_its_own_params_and_keeps_no_kv(worker):
    going_on = _context(worker)["choices"][0]
    first = going_on["disaggregated_params"]["first_gen_tokens"][0]
    held = worker.engine.stats()["used_blocks"]
    assert going_on["finish_reason"] == "not_finished" and held > 0      # kept for a generation worker

    answer = _context(worker, stop_token_ids=[first])
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["disaggregated_params"] == {"request_type": "context_only", "first_gen_tokens": None,
                                              "ctx_request_id": None, "encoded_opaque_state": None,
                                              "draft_tokens": None}
    assert answer["prompt_token_ids"] == PROMPT
    assert worker.engine.stats()["used_blocks"] == held                  # nothing more is held for it
