"""Prefill and decode engines joined by the real KV exporter/importer (sockets, shared memory),
against the colocated engine: same greedy tokens; KV blocks always come back."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trtpd.engine.loader import KvTransferOptions, load_engine
from trtpd.engine.loop import EngineLoop
from trtpd.engine.request import EngineRequest, RequestType
from trtpd.bench.prompts import prompt_with_tokens

pytestmark = pytest.mark.integration


class Collector:
    def __init__(self):
        self.tokens: dict[str, list[int]] = {}
        self.outputs: dict[str, list] = {}
        self.cond = threading.Condition()

    def __call__(self, out):
        with self.cond:
            self.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            self.outputs.setdefault(out.request_id, []).append(out)
            self.cond.notify_all()

    def wait(self, pred, timeout_s=60.0):
        with self.cond:
            assert self.cond.wait_for(pred, timeout_s), "timed out waiting for engine outputs"

    def finished(self, rid):
        return any(o.finished for o in self.outputs.get(rid, []))


def wait_until(pred, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


@pytest.fixture(params=["shm", "tcp"])
def pair(request, fp16_root, tmp_path):
    """A prefill and a decode engine, each on its loop. Prefill holds unpulled KV for 30 s (the default), so no
    test depends on decode pulling within a short time; a test of the timeout itself marks the export timeout
    it wants: @pytest.mark.kv_timeout_ms(1500)."""
    marker = request.node.get_closest_marker("kv_timeout_ms")
    kv = KvTransferOptions(transport=request.param, key_file=tmp_path / "kv.key",
                           timeout_ms=marker.args[0] if marker else 30000)
    prefill = load_engine(fp16_root / "prefill-tp1", kv)
    decode = load_engine(fp16_root / "decode-tp1", kv)
    pc, dc = Collector(), Collector()
    ploop, dloop = EngineLoop(prefill.engine, pc), EngineLoop(decode.engine, dc)
    yield prefill, decode, ploop, dloop, pc, dc
    ploop.stop()
    dloop.stop()
    prefill.close()
    decode.close()


def colocated_tokens(root: Path, prompts, max_new):
    coloc = load_engine(root / "colocated-tp1")
    c = Collector()
    loop = EngineLoop(coloc.engine, c)
    for i, p in enumerate(prompts):
        loop.submit(EngineRequest(f"c{i}", p, max_new, arrival_s=time.monotonic()))
    c.wait(lambda: all(c.finished(f"c{i}") for i in range(len(prompts))))
    loop.stop()
    coloc.close()
    return [c.tokens[f"c{i}"] for i in range(len(prompts))]


def run_disaggregated(prefill, decode, ploop, dloop, pc, dc, prompts, max_new):
    for i, p in enumerate(prompts):
        ploop.submit(EngineRequest(f"p{i}", p, max_new, RequestType.CONTEXT_ONLY, arrival_s=time.monotonic()))
    for i, p in enumerate(prompts):  # dispatch decode on the early handle, like the BLS
        pc.wait(lambda: any(o.context_phase_params for o in pc.outputs.get(f"p{i}", [])))
        handle = next(o.context_phase_params for o in pc.outputs[f"p{i}"] if o.context_phase_params)
        req = EngineRequest(f"d{i}", p, max_new, RequestType.GENERATION_ONLY, context_phase_params=handle,
                            arrival_s=time.monotonic())
        decode.engine.validate(req)
        dloop.submit(req)
    dc.wait(lambda: all(dc.finished(f"d{i}") for i in range(len(prompts))))
    errors = [o.error for i in range(len(prompts)) for o in dc.outputs[f"d{i}"] if o.error]
    assert not errors
    return [dc.tokens[f"d{i}"] for i in range(len(prompts))]


def test_disaggregated_equals_colocated_and_blocks_return(pair, fp16_root):
    prefill, decode, ploop, dloop, pc, dc = pair
    tok = prefill.tokenizer
    prompts = [tok.encode(prompt_with_tokens(tok, n, seed=n)) for n in (2, 33, 64, 65, 300, 1000)]
    start_free = prefill.engine.stats()["free_blocks"], decode.engine.stats()["free_blocks"]
    got = run_disaggregated(prefill, decode, ploop, dloop, pc, dc, prompts, 12)
    assert got == colocated_tokens(fp16_root, prompts, 12)
    for i, p in enumerate(prompts):
        transfer = next(o.perf for o in dc.outputs[f"d{i}"] if "kv_bytes" in o.perf)
        assert transfer["kv_bytes"] == prefill.pool.layout.bytes_for(len(p))
    wait_until(lambda: prefill.engine.stats()["free_blocks"] == start_free[0])
    assert decode.engine.stats()["free_blocks"] == start_free[1]


@pytest.mark.kv_timeout_ms(1500)
def test_unpulled_kv_is_freed_after_the_transfer_timeout(pair):
    prefill, _, ploop, _, pc, _ = pair
    start = prefill.engine.stats()["free_blocks"]
    prompt = prefill.tokenizer.encode(prompt_with_tokens(prefill.tokenizer, 200, seed=1))
    ploop.submit(EngineRequest("orphan", prompt, 4, RequestType.CONTEXT_ONLY, arrival_s=time.monotonic()))
    pc.wait(lambda: pc.finished("orphan"))
    assert prefill.engine.stats()["free_blocks"] < start      # held for decode
    wait_until(lambda: prefill.engine.stats()["free_blocks"] == start, timeout_s=10)


def test_cancelled_requests_return_their_blocks(pair):
    prefill, decode, ploop, dloop, pc, dc = pair
    start = prefill.engine.stats()["free_blocks"], decode.engine.stats()["free_blocks"]
    prompt = prefill.tokenizer.encode(prompt_with_tokens(prefill.tokenizer, 400, seed=2))
    ploop.submit(EngineRequest("p", prompt, 400, RequestType.CONTEXT_ONLY, arrival_s=time.monotonic()))
    pc.wait(lambda: pc.finished("p"))
    handle = [o.context_phase_params for o in pc.outputs["p"] if o.context_phase_params][-1]
    req = EngineRequest("d", prompt, 400, RequestType.GENERATION_ONLY, context_phase_params=handle,
                        arrival_s=time.monotonic())
    decode.engine.validate(req)
    dloop.submit(req)
    dc.wait(lambda: len(dc.tokens.get("d", [])) >= 3)
    dloop.abort("d")
    dc.wait(lambda: dc.finished("d"))
    assert dc.outputs["d"][-1].finish_reason == "cancelled"
    wait_until(lambda: decode.engine.stats()["free_blocks"] == start[1])
    wait_until(lambda: prefill.engine.stats()["free_blocks"] == start[0])


def test_layerwise_handle_goes_out_before_any_layer_is_computed(pair):
    """The layer-wise handle must reach decode while prefill still computes: at the moment the engine
    delivers it, no layer of that request is ready yet (so the pull overlaps the whole forward pass)."""
    prefill, decode, ploop, dloop, pc, dc = pair
    layers_at_delivery = []
    table = prefill.engine.exporter._table

    def record(out):
        if out.context_phase_params:
            with table.cond:
                layers_at_delivery.append(table.exports[out.request_id].num_layers_ready)
        pc(out)

    ploop.on_output = record
    prompt = prefill.tokenizer.encode(prompt_with_tokens(prefill.tokenizer, 1000, seed=9))
    ploop.submit(EngineRequest("lw", prompt, 8, RequestType.CONTEXT_ONLY, arrival_s=time.monotonic(),
                               layerwise_kv_transfer=True))
    pc.wait(lambda: pc.finished("lw"))
    assert layers_at_delivery == [0]
    handle = pc.outputs["lw"][0].context_phase_params
    req = EngineRequest("lw-d", prompt, 8, RequestType.GENERATION_ONLY, context_phase_params=handle,
                        arrival_s=time.monotonic())
    decode.engine.validate(req)
    dloop.submit(req)
    dc.wait(lambda: dc.finished("lw-d"))
    assert len(dc.tokens["lw-d"]) == 8 and not any(o.error for o in dc.outputs["lw-d"])


def test_a_decode_request_cancelled_before_its_pull_gives_its_kv_up(fp16_root, tmp_path):
    """Cancelled while it waits for admission (here: before the decode engine ever stepped), a request's handle is
    given up: prefill frees its blocks at once, not at the export's deadline (60 s here)."""
    kv = KvTransferOptions(transport="tcp", key_file=tmp_path / "kv.key", timeout_ms=60000)
    prefill = load_engine(fp16_root / "prefill-tp1", kv)
    decode = load_engine(fp16_root / "decode-tp1", kv)
    pc = Collector()
    ploop = EngineLoop(prefill.engine, pc)
    try:
        start = prefill.engine.stats()["free_blocks"]
        prompt = prefill.tokenizer.encode(prompt_with_tokens(prefill.tokenizer, 200, seed=3))
        ploop.submit(EngineRequest("p", prompt, 4, RequestType.CONTEXT_ONLY, arrival_s=time.monotonic()))
        pc.wait(lambda: pc.finished("p"))
        handle = [o.context_phase_params for o in pc.outputs["p"] if o.context_phase_params][-1]
        assert prefill.engine.stats()["free_blocks"] < start      # held for decode
        req = EngineRequest("d", prompt, 4, RequestType.GENERATION_ONLY, context_phase_params=handle,
                            arrival_s=time.monotonic())
        decode.engine.validate(req)
        decode.engine.add(req)                                      # admitted; its pull starts at the next step
        assert [o.finish_reason for o in decode.engine.abort("d")] == ["cancelled"]
        wait_until(lambda: prefill.engine.stats()["free_blocks"] == start, timeout_s=10)
        assert prefill.engine.exporter.num_given_up == 1 and prefill.engine.exporter.num_timeouts == 0
        assert decode.engine.stats()["free_blocks"] == decode.config.num_kv_blocks
    finally:
        ploop.stop()
        prefill.close()
        decode.close()
