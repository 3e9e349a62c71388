"""The simulator's KV block accounting: BlockAllocator's counts without its block ids.

The simulator's fast path decides with the shared ContinuousBatchScheduler, which asks its allocator
how many blocks are free, takes blocks for a prompt and frees a sequence's block table; it never reads
a block id. BlockCounter keeps the same counts (and refuses the same over-allocation and over-free)
with a block table that is a list of the right length, so a simulated instance with a large KV pool
costs no list of ids. exact_steps runs use BlockAllocator itself (tests compare the two).
"""

from __future__ import annotations

from trtpd.sched.block_allocator import BlockAllocator


class BlockCounter(BlockAllocator):
    def __init__(self, num_blocks: int, tokens_per_block: int) -> None:  # noqa: D107 (no ids: see the module)
        if num_blocks <= 0 or tokens_per_block <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and tokens_per_block ({tokens_per_block}) must be positive")
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self._num_free = num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self._num_free

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self._num_free

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks > self._num_free:
            raise RuntimeError(f"KV cache exhausted: asked for {num_blocks} blocks, {self._num_free} free")
        if num_blocks <= 0:
            return []
        self._num_free -= num_blocks
        return [0] * num_blocks

    def free(self, block_ids: list[int]) -> None:
        if self._num_free + len(block_ids) > self.num_blocks:
            raise RuntimeError(f"freeing {len(block_ids)} KV blocks with {self.num_used_blocks} in use (double free)")
        self._num_free += len(block_ids)
