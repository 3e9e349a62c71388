"""KV blocks a context (prefill) request reserves on the compiled-engine path, by the output length it carries.

Under guaranteed_no_evict TensorRT-LLM admits a request only when the blocks it could ever need are free:
ceil(min(prompt + max_new_tokens, window) / tokens_per_block) (KVCacheManager::getRemainingBlocksToCompletion,
cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp, used by GuaranteedNoEvictScheduler through
NoEvictScheduledBlocksManager::enoughAvailableBlocks; no exception for context-only requests). A context-only
request writes only its prompt's KV, so prompt + N reserves N / tokens_per_block blocks that are never
written but must be free when the batch is admitted. README ("Context requests: output length") has the
numbers for the pinned models and trtpd's choice; this module computes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtpd.catalog import KvDtype, ModelSpec


def reserved_blocks(prompt_tokens: int, output_tokens: int, tokens_per_block: int, window: int | None = None) -> int:
    """Blocks guaranteed_no_evict needs free to admit one new request (beam width 1, no sink tokens)."""
    tokens = prompt_tokens + output_tokens
    return math.ceil((tokens if window is None else min(tokens, window)) / tokens_per_block)


@dataclass(frozen=True)
class ContextBatchReserve:
    """One full context batch of equal prompts: how many requests, and the blocks and bytes it must find free."""

    num_requests: int
    blocks_per_request: int
    blocks: int
    bytes_total: int          # over all TP ranks; a rank holds bytes_total / tp


def context_batch_reserve(model: ModelSpec, kv_dtype: KvDtype, prompt_tokens: int, output_tokens: int, *,
                          max_num_tokens: int, max_batch_size: int, tokens_per_block: int) -> ContextBatchReserve:
    """A batch filled to the token budget (or to max_batch_size) with `prompt_tokens`-token prompts, each carrying
    an output length of `output_tokens`."""
    num = min(max_batch_size, max_num_tokens // prompt_tokens)
    per = reserved_blocks(prompt_tokens, output_tokens, tokens_per_block)
    return ContextBatchReserve(num, per, num * per, num * per * tokens_per_block * model.kv_bytes_per_token(kv_dtype))
