import numpy as np
import pytest
import torch

from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool
from trtpd.kv.spans import check_blocks, copy_plan, layer_stride_bytes, pool_bytes, request_spans

LAYOUT = KvLayout(num_layers=3, num_kv_heads=2, head_size=4, tokens_per_block=8, dtype="fp16")


@pytest.mark.parametrize("num_tokens", [1, 7, 8, 9, 24, 29])
def test_spans_hold_exactly_the_valid_tokens(num_tokens):
    block_ids = [5, 2, 7, 0][:-(-num_tokens // 8)]
    spans = request_spans(LAYOUT, block_ids, num_tokens)
    assert sum(size for _, size in spans) * LAYOUT.num_layers == LAYOUT.bytes_for(num_tokens)


def test_sequential_blocks_merge_into_one_span_per_layer():
    assert request_spans(LAYOUT, [3, 4, 5], 24) == [(3 * 256, 3 * 256)]
    # a partial last block: its K part joins the full blocks, its V part stands alone
    assert request_spans(LAYOUT, [3, 4], 10) == [(3 * 256, 256 + 2 * 16), (4 * 256 + 128, 2 * 16)]


def reference_copy(src: KvPool, dst: KvPool, src_ids, dst_ids, num_tokens):
    for layer in range(LAYOUT.num_layers):
        for i, (s, d) in enumerate(zip(src_ids, dst_ids)):
            n = min(8, num_tokens - 8 * i)
            dst.layers[layer][d, :, :n] = src.layers[layer][s, :, :n]


@pytest.mark.parametrize("src_ids,dst_ids,num_tokens", [
    ([0, 1, 2], [0, 1, 2], 20), ([6, 1, 3], [2, 5, 0], 17), ([4, 5, 6, 7], [1, 2, 3, 4], 32), ([9], [0], 3),
    ([0, 1, 2], [5, 3, 8], 20), ([2, 3, 4], [6, 7, 0], 24)])   # contiguous on one side only
def test_copy_plan_moves_the_same_bytes_as_a_token_by_token_copy(src_ids, dst_ids, num_tokens):
    src, expected, actual = KvPool(LAYOUT, 10), KvPool(LAYOUT, 12), KvPool(LAYOUT, 12)
    src.data.copy_(torch.randn(src.data.shape))
    expected.data.fill_(-1.0)
    actual.data.fill_(-1.0)
    reference_copy(src, expected, src_ids, dst_ids, num_tokens)
    src_bytes, dst_bytes = pool_bytes(src), pool_bytes(actual)
    moved = 0
    for layer in range(LAYOUT.num_layers):
        for s, d, n in copy_plan(LAYOUT, src_ids, dst_ids, num_tokens):
            s, d = s + layer * layer_stride_bytes(LAYOUT, 10), d + layer * layer_stride_bytes(LAYOUT, 12)
            dst_bytes[d:d + n] = src_bytes[s:s + n]
            moved += n
    assert moved == LAYOUT.bytes_for(num_tokens)
    assert np.array_equal(pool_bytes(expected), pool_bytes(actual))


def test_pool_bytes_is_a_writable_view_for_every_dtype():
    for dtype in ("fp16", "bf16", "fp8"):
        pool = KvPool(KvLayout(1, 1, 2, 2, dtype), 1)
        view = pool_bytes(pool)
        assert view.nbytes == pool.nbytes
        view[:] = 0x3C
        assert pool.data.view(torch.uint8).eq(0x3C).all()


@pytest.mark.parametrize("block_ids,num_tokens,match", [
    ([0, 1], 20, "need 3 blocks"), ([0, 1, 10], 20, r"in \[0, 10\)"), ([0, 0, 1], 20, "distinct"),
    ([], 0, "must be positive")])
def test_check_blocks_names_the_problem(block_ids, num_tokens, match):
    with pytest.raises(ValueError, match=match):
        check_blocks(LAYOUT, 10, block_ids, num_tokens, "request 'r'")
