"""A prefill pool on this host, mapped read-only by the decode side so it can copy blocks straight out of it.

Mappings are cached per segment name and made again when the segment is replaced (a restarted prefill
instance) or changes size. MAP_POPULATE maps every page up front, so pulls do not pay page faults.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass

import numpy as np

from trtpd.kv.errors import KvConnectError
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import SHM_DIR, KvPool


@dataclass
class ShmPoolMapping:
    shm_name: str
    inode: int
    num_blocks: int
    array: np.ndarray              # read-only uint8 view of the whole pool
    mapping: mmap.mmap

    @property
    def address(self) -> int:
        return self.array.ctypes.data


class ShmPoolSources:
    def __init__(self) -> None:
        self._mappings: dict[str, ShmPoolMapping] = {}
        self._lock = threading.Lock()

    def get(self, shm_name: str, layout: KvLayout, num_blocks: int, where: str) -> ShmPoolMapping:
        path = SHM_DIR / shm_name
        num_bytes = KvPool.nbytes_for(layout, num_blocks)
        with self._lock:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise KvConnectError(
                    f"{where}: shared-memory KV pool {path} does not exist on this host; the shm transport works "
                    f"only when prefill and decode share a host and /dev/shm: use transport 'tcp' otherwise") from None
            try:
                stat = os.fstat(fd)
                cached = self._mappings.get(shm_name)
                if cached and cached.inode == stat.st_ino and cached.num_blocks == num_blocks:
                    return cached
                if stat.st_size != num_bytes:
                    raise KvConnectError(f"{where}: {path} has {stat.st_size} bytes, the exporter announced "
                                         f"{num_blocks} blocks ({num_bytes} bytes); is another pool using this name?")
                mapping = mmap.mmap(fd, num_bytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            source = ShmPoolMapping(shm_name, stat.st_ino, num_blocks, np.frombuffer(mapping, dtype=np.uint8),
                                    mapping)
            self._mappings[shm_name] = source
            return source

    def close(self) -> None:
        with self._lock:
            mappings, self._mappings = self._mappings, {}
        for source in mappings.values():
            source.array = np.empty(0, np.uint8)
            try:
                source.mapping.close()
            except BufferError:
                pass    # a pull still copies from it; unmapped when collected
