"""KV pulls between a real prefill process (exporter_child.py) and this process, over tcp, shm and ucx."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from trtpd.kv.auth import NONCE_BYTES, PROOF_BYTES
from trtpd.kv.frame import HEADER_BYTES
from trtpd.kv.importer import KvImporter
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool

from tests.integration.kv.conftest import transports_under_test

pytestmark = pytest.mark.integration
TRANSPORTS = transports_under_test()
SENTINEL = 0xAB


def small_layout(dtype: str) -> KvLayout:
    return KvLayout(num_layers=4, num_kv_heads=2, head_size=16, tokens_per_block=8, dtype=dtype)


def decode_pool(layout: KvLayout, num_blocks: int = 16) -> KvPool:
    pool = KvPool(layout, num_blocks)
    np.copyto(pool.data.view(torch.uint8).numpy(), SENTINEL)
    return pool


def assert_pulled(exporter, dst: KvPool, requests: list[tuple[list[int], list[int], int]]) -> None:
    """For each (src_ids, dst_ids, num_tokens): valid tokens equal the prefill pool bit for bit.
    Every other decode byte is untouched."""
    layout = dst.layout
    expected = exporter.expected_bytes()
    actual = dst.data.view(torch.uint8).view(layout.num_layers, dst.num_blocks, 2, layout.tokens_per_block, -1)
    untouched = torch.ones(actual.shape[:4], dtype=torch.bool)
    for src_ids, dst_ids, num_tokens in requests:
        for i, (src_id, dst_id) in enumerate(zip(src_ids, dst_ids)):
            n = min(layout.tokens_per_block, num_tokens - i * layout.tokens_per_block)
            assert torch.equal(actual[:, dst_id, :, :n], expected[:, src_id, :, :n]), f"block {i} differs"
            untouched[:, dst_id, :, :n] = False
    assert actual[untouched].eq(SENTINEL).all(), "bytes outside the requests' tokens were written"


def wait_for(condition: threading.Condition, predicate, timeout_s: float = 10.0) -> None:
    with condition:
        assert condition.wait_for(predicate, timeout=timeout_s), "condition not met before the deadline"


def start_pull(importer, params, dst_ids, on_layer=None) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = importer.pull(params, dst_ids, on_layer=on_layer)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            outcome["error"] = e
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


class LayerLog:
    def __init__(self) -> None:
        self.layers: list[int] = []
        self.cond = threading.Condition()

    def __call__(self, layer: int) -> None:
        with self.cond:
            self.layers.append(layer)
            self.cond.notify_all()


@pytest.mark.parametrize("dtype", ["fp16", "fp8"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_pull_is_bit_exact_and_moves_exactly_the_request_bytes(exporters, transport, dtype):
    layout = small_layout(dtype)
    exporter = exporters.start(transport, layout)
    dst = decode_pool(layout)
    importer = KvImporter(dst, exporters.key)
    src_ids, dst_ids, num_tokens = [7, 2, 11, 3, 0], [4, 9, 1, 12, 6], 4 * 8 + 5     # partial last block
    exporter.register("req-1", src_ids, num_tokens)
    params = importer.verify(exporter.complete("req-1", 31999), time.time())
    result = importer.pull(params, dst_ids)
    assert result.first_token == 31999
    assert result.bytes_moved == layout.bytes_for(num_tokens)
    headers_bytes = HEADER_BYTES * (layout.num_layers + 4) + 8 + NONCE_BYTES + PROOF_BYTES   # + HELLO, nonce, proof
    if transport == "tcp":
        assert result.wire_bytes == layout.bytes_for(num_tokens) + headers_bytes
    elif transport == "shm":
        assert result.wire_bytes == headers_bytes + 36 + 4 * len(src_ids)
    else:   # ACCEPT names the channel's address (u16 length, address) and the source blocks; KV on the channel
        address_bytes = result.wire_bytes - headers_bytes - 2 - 4 * len(src_ids)
        assert 0 < address_bytes < 1024
    assert len(result.layer_done_s) == layout.num_layers
    assert_pulled(exporter, dst, [(src_ids, dst_ids, num_tokens)])
    assert exporter.wait_released("req-1")
    stats = exporter.stats()
    assert (stats["num_pending"], stats["num_pulls"], stats["bytes_sent"]) == (0, 1, layout.bytes_for(num_tokens))
    importer.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_puller_started_early_receives_each_layer_as_prefill_makes_it_ready(exporters, transport):
    layout = small_layout("fp16")
    exporter = exporters.start(transport, layout)
    dst = decode_pool(layout)
    importer = KvImporter(dst, exporters.key)
    params = importer.verify(exporter.register("req-lw", [3, 1, 4], 20), time.time())
    assert params.first_token is None                    # issued before any layer was computed
    log = LayerLog()
    puller, outcome = start_pull(importer, params, [0, 1, 2], on_layer=log)
    for layer in range(layout.num_layers):
        exporter.mark(["req-lw"], layer)
        wait_for(log.cond, lambda: len(log.layers) == layer + 1)
        assert log.layers == list(range(layer + 1))      # received layer by layer, never ahead of prefill
    assert puller.is_alive() and not outcome             # still waiting for the first token
    exporter.complete("req-lw", 5)
    puller.join(timeout=10)
    assert outcome["result"].first_token == 5
    assert_pulled(exporter, dst, [([3, 1, 4], [0, 1, 2], 20)])
    assert exporter.wait_released("req-lw")
    importer.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_concurrent_pulls_from_worker_threads(exporters, transport):
    layout = small_layout("fp8")
    exporter = exporters.start(transport, layout, num_blocks=12)
    dst = decode_pool(layout, num_blocks=12)
    importer = KvImporter(dst, exporters.key)
    requests = {"a": ([0, 1, 2], [10, 9, 11], 17), "b": ([5, 3], [0, 4], 16), "c": ([8, 6, 7, 9], [1, 2, 3, 5], 30)}
    pulls = {}
    for request_id, (src_ids, dst_ids, num_tokens) in requests.items():
        params = importer.verify(exporter.register(request_id, src_ids, num_tokens), time.time())
        pulls[request_id] = start_pull(importer, params, dst_ids)
    for layer in range(layout.num_layers):
        exporter.mark(list(requests), layer)              # one prefill batch
    for request_id in requests:
        exporter.complete(request_id, ord(request_id))
    for request_id, (thread, outcome) in pulls.items():
        thread.join(timeout=10)
        assert outcome["result"].first_token == ord(request_id), outcome
    assert_pulled(exporter, dst, list(requests.values()))
    for request_id in requests:
        assert exporter.wait_released(request_id)
    assert exporter.stats()["num_pulls"] == 3
    importer.close()
