"""A prefill pool on this host, mapped read-only by the decode side so it can copy blocks straight out of it.

The exporter's ACCEPT names its segment exactly: the kernel's boot id, the segment's device and inode, and
the pool's block count (ShmPoolIdentity, 36 bytes), then one u32 per block of the request. The importer maps
/dev/shm/<name> only if it is that very file, so a same-named segment of another host or container is
never read. Mappings are cached per name and made again when the segment changes. MAP_POPULATE maps every
page up front, so pulls do not pay page faults.

Who can map a pool: the segment is created 0600 (pool.py), so only the prefill server's uid can open it.
The shm name in a handle is no capability: another uid that learns it (or a whole handle) gets EACCES
from open(), and the pull itself needs the deployment key (auth.py), so it never learns the block ids.
The ACCEPT that names the segment's identity is authenticated by the exporter's proof, so a same-named
file planted by someone else is refused by the device/inode check below.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtpd.kv.errors import KvConnectError, KvProtocolError
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import SHM_DIR, KvPool

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def host_boot_id() -> bytes:
    try:
        return bytes.fromhex(BOOT_ID_PATH.read_text().strip().replace("-", ""))
    except (OSError, ValueError):
        return bytes(16)


@dataclass(frozen=True)
class ShmPoolIdentity:
    boot_id: bytes
    device: int
    inode: int
    num_blocks: int

    FORMAT = struct.Struct("!16sQQI")     # 36 bytes

    @classmethod
    def of(cls, shm_name: str, num_blocks: int) -> "ShmPoolIdentity":
        stat = os.stat(SHM_DIR / shm_name)
        return cls(host_boot_id(), stat.st_dev, stat.st_ino, num_blocks)

    def pack_accept(self, block_ids: list[int]) -> bytes:
        """ACCEPT payload of a shm pull: this identity, then one u32 per block of the request."""
        return self.FORMAT.pack(self.boot_id, self.device, self.inode, self.num_blocks) + \
            struct.pack(f"!{len(block_ids)}I", *block_ids)

    @classmethod
    def unpack_accept(cls, payload: bytes) -> tuple["ShmPoolIdentity", list[int]]:
        size = cls.FORMAT.size
        if len(payload) < size or (len(payload) - size) % 4:
            raise KvProtocolError(f"malformed shm ACCEPT payload ({len(payload)} bytes)")
        identity = cls(*cls.FORMAT.unpack(payload[:size]))
        return identity, list(struct.unpack(f"!{(len(payload) - size) // 4}I", payload[size:]))


@dataclass
class ShmPoolMapping:
    identity: ShmPoolIdentity
    array: np.ndarray              # read-only uint8 view of the whole pool
    mapping: mmap.mmap

    @property
    def address(self) -> int:
        return self.array.ctypes.data


class ShmPoolSources:
    def __init__(self) -> None:
        self._mappings: dict[str, ShmPoolMapping] = {}
        self._lock = threading.Lock()

    def get(self, shm_name: str, identity: ShmPoolIdentity, layout: KvLayout, where: str) -> ShmPoolMapping:
        path = SHM_DIR / shm_name
        use_tcp = "the shm transport needs prefill and decode on the same host with the same /dev/shm; use tcp"
        if identity.boot_id != host_boot_id():
            raise KvConnectError(f"{where}: the exporter runs on another host (kernel boot id differs); {use_tcp}")
        num_bytes = KvPool.nbytes_for(layout, identity.num_blocks)
        with self._lock:
            cached = self._mappings.get(shm_name)
            if cached is not None and cached.identity == identity:
                return cached
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise KvConnectError(f"{where}: {path} does not exist here; {use_tcp}") from None
            except PermissionError:
                raise KvConnectError(f"{where}: permission denied opening {path}: the prefill pool is private to "
                                     f"its owner (mode 0600); run decode as the same user as prefill") from None
            try:
                stat = os.fstat(fd)
                if (stat.st_dev, stat.st_ino) != (identity.device, identity.inode):
                    raise KvConnectError(f"{where}: {path} here is not the exporter's segment (another container's "
                                         f"/dev/shm, or a replaced pool); {use_tcp}")
                if stat.st_size != num_bytes:
                    raise KvConnectError(f"{where}: {path} has {stat.st_size} bytes, the exporter announced "
                                         f"{identity.num_blocks} blocks ({num_bytes} bytes) of this layout")
                mapping = mmap.mmap(fd, num_bytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            source = ShmPoolMapping(identity, np.frombuffer(mapping, dtype=np.uint8), mapping)
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
