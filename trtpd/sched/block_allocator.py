"""Paged KV-cache block accounting: which block ids are free, which are used, who holds them.

No tensors here; the reference engine's KV pool and the simulator both use this bookkeeping.
"""

from __future__ import annotations


def num_blocks_for(num_tokens: int, tokens_per_block: int) -> int:
    return -(-num_tokens // tokens_per_block)


class BlockAllocator:
    def __init__(self, num_blocks: int, tokens_per_block: int) -> None:
        if num_blocks <= 0 or tokens_per_block <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and tokens_per_block ({tokens_per_block}) must be positive")
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.free_block_ids: list[int] = list(range(num_blocks - 1, -1, -1))   # a stack: lowest ids first
        self.used_block_ids: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return len(self.used_block_ids)

    def blocks_for(self, num_tokens: int) -> int:
        return num_blocks_for(num_tokens, self.tokens_per_block)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_block_ids)

    def allocate(self, num_blocks: int) -> list[int]:
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"KV cache exhausted: asked for {num_blocks} blocks, {self.num_free_blocks} free")
        if num_blocks <= 0:
            return []
        ids = self.free_block_ids[-num_blocks:][::-1]
        del self.free_block_ids[-num_blocks:]
        self.used_block_ids.update(ids)
        return ids

    def free(self, block_ids: list[int]) -> None:
        freed = set(block_ids)
        if len(freed) != len(block_ids) or not freed <= self.used_block_ids:
            bad = sorted(set(b for b in block_ids if b not in self.used_block_ids or block_ids.count(b) > 1))
            raise RuntimeError(f"double free of KV block(s) {bad}")
        self.used_block_ids -= freed
        self.free_block_ids.extend(reversed(block_ids))
