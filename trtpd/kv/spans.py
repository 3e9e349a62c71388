"""Where a request's valid KV bytes lie inside a pool: byte spans of one layer, in transfer order.

A pool's memory is [num_layers, num_blocks, 2 (K, V), tokens_per_block, kv_heads, head_size]. The bytes of
request token t of layer l are in block block_ids[t // tokens_per_block]. Transfer order, per layer: block
by block; a full block is one span (its K then its V); the last block, holding r < tokens_per_block tokens,
is two spans (K[:r], then V[:r]). Spans that touch in memory are merged (sequential block ids make one span
per layer), so a layer of a request is exactly num_tokens x bytes_per_token_per_layer bytes.
"""

from __future__ import annotations

import numpy as np
import torch

from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool
from trtpd.sched.block_allocator import num_blocks_for


def layer_stride_bytes(layout: KvLayout, pool_num_blocks: int) -> int:
    return pool_num_blocks * layout.bytes_per_block_per_layer


def _pieces(layout: KvLayout, block_ids: list[int], num_tokens: int) -> list[tuple[int, int]]:
    """(offset_bytes, num_bytes) of layer 0, in transfer order, unmerged."""
    block_bytes = layout.bytes_per_block_per_layer
    half_bytes = block_bytes // 2                      # K (or V) of one block
    token_bytes = half_bytes // layout.tokens_per_block
    pieces = []
    for i, block_id in enumerate(block_ids):
        num_valid = min(layout.tokens_per_block, num_tokens - i * layout.tokens_per_block)
        start = block_id * block_bytes
        if num_valid == layout.tokens_per_block:
            pieces.append((start, block_bytes))
        else:
            pieces += [(start, num_valid * token_bytes), (start + half_bytes, num_valid * token_bytes)]
    return pieces


def check_blocks(layout: KvLayout, pool_num_blocks: int, block_ids: list[int], num_tokens: int, side: str) -> None:
    if num_tokens <= 0:
        raise ValueError(f"{side}: num_tokens must be positive, got {num_tokens}")
    needed = num_blocks_for(num_tokens, layout.tokens_per_block)
    if len(block_ids) != needed:
        raise ValueError(f"{side}: {num_tokens} tokens need {needed} blocks of {layout.tokens_per_block} tokens, "
                         f"got {len(block_ids)} block ids")
    bad = [b for b in block_ids if not 0 <= b < pool_num_blocks]
    if bad or len(set(block_ids)) != len(block_ids):
        raise ValueError(f"{side}: block ids must be distinct and in [0, {pool_num_blocks}), got {list(block_ids)}")


def request_spans(layout: KvLayout, block_ids: list[int], num_tokens: int) -> list[tuple[int, int]]:
    """(offset_bytes, num_bytes) of the request's layer-0 bytes in transfer order, merged where contiguous.
    Layer l is the same list shifted by l x layer_stride_bytes."""
    spans: list[tuple[int, int]] = []
    for offset, size in _pieces(layout, block_ids, num_tokens):
        if spans and spans[-1][0] + spans[-1][1] == offset:
            spans[-1] = (spans[-1][0], spans[-1][1] + size)
        else:
            spans.append((offset, size))
    return spans


def copy_plan(layout: KvLayout, src_block_ids: list[int], dst_block_ids: list[int],
              num_tokens: int) -> list[tuple[int, int, int]]:
    """(src_offset_bytes, dst_offset_bytes, num_bytes) for layer 0, merged where both sides are contiguous."""
    plan: list[tuple[int, int, int]] = []
    src_pieces = _pieces(layout, src_block_ids, num_tokens)
    dst_pieces = _pieces(layout, dst_block_ids, num_tokens)
    for (src, size), (dst, _) in zip(src_pieces, dst_pieces):
        if plan and plan[-1][0] + plan[-1][2] == src and plan[-1][1] + plan[-1][2] == dst:
            plan[-1] = (plan[-1][0], plan[-1][1], plan[-1][2] + size)
        else:
            plan.append((src, dst, size))
    return plan


def pool_bytes(pool: KvPool) -> np.ndarray:
    """The pool's memory as a flat, writable uint8 array (no copy)."""
    return pool.data.view(torch.uint8).reshape(-1).numpy()
