"""A paged KV-cache pool: one tensor per layer, [num_blocks, 2 (K,V), tokens_per_block, kv_heads, head_size].

The pool can live in a named POSIX shared-memory segment, so that a decode process on the same host
can map it and copy blocks straight out of it (the CPU analogue of CUDA IPC over NVLink).
fp8 blocks are stored as uint8 holding float8_e4m3fn bits.
A shared segment is created 0600 (O_EXCL, so an existing file of that name is never adopted): only its
owner's uid can map it; other local users cannot read or write the KV cache through /dev/shm.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import torch

from trtpd.catalog import KvDtype
from trtpd.kv.layout import KvLayout

STORAGE_DTYPE = {KvDtype.FP16: torch.float16, KvDtype.BF16: torch.bfloat16, KvDtype.FP8: torch.uint8}
SHM_DIR = Path("/dev/shm")


class KvPool:
    def __init__(self, layout: KvLayout, num_blocks: int, *, shm_name: str | None = None,
                 create: bool = True) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.layout = layout
        self.num_blocks = num_blocks
        self.shm_name = shm_name
        self.storage_dtype = STORAGE_DTYPE[layout.dtype]
        self._mmap: mmap.mmap | None = None
        self._owner = create
        shape = (layout.num_layers, num_blocks, 2, layout.tokens_per_block, layout.num_kv_heads, layout.head_size)
        if shm_name is None:
            self.data = torch.zeros(shape, dtype=self.storage_dtype)
        else:
            nbytes = self.nbytes_for(layout, num_blocks)
            path = SHM_DIR / shm_name
            flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
            fd = os.open(path, flags, 0o600)
            try:
                if create:
                    os.ftruncate(fd, nbytes)
                elif os.fstat(fd).st_size != nbytes:
                    raise ValueError(f"shared KV pool {path} has {os.fstat(fd).st_size} bytes, expected {nbytes} "
                                     f"for this layout; the prefill and decode layouts differ")
                self._mmap = mmap.mmap(fd, nbytes)
            finally:
                os.close(fd)
            flat = torch.frombuffer(self._mmap, dtype=torch.uint8)
            self.data = flat.view(self.storage_dtype).view(shape)
        self.layers: list[torch.Tensor] = list(self.data.unbind(0))

    @staticmethod
    def nbytes_for(layout: KvLayout, num_blocks: int) -> int:
        return layout.num_layers * num_blocks * layout.bytes_per_block_per_layer

    @property
    def nbytes(self) -> int:
        return self.nbytes_for(self.layout, self.num_blocks)

    def close(self) -> None:
        """Releases the mapping; the creating process also removes the segment."""
        self.layers = []
        self.data = torch.empty(0)
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # a tensor view still exists; the mapping goes when it is collected
            self._mmap = None
        if self._owner and self.shm_name:
            try:
                (SHM_DIR / self.shm_name).unlink()
            except FileNotFoundError:
                pass
