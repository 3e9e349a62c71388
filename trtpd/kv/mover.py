"""Byte movers beside the TCP control connection: the KV bytes of a ucx or mpi pull travel on a channel of their own.

The control path is the same for every transport (frame.py: HELLO, PULL with the key proof, ACCEPT with the
exporter's proof, LAYER headers as layers become ready, DONE, ACK, CONFIRM); only the bytes move elsewhere:

    exporter -> importer  ACCEPT   proof (32) | u16 address length | mover address | u32 per source block id
    (mpi only)            on the control socket: a link request and its answer (reuse the intercommunicator
                          the two processes keep, or the port name of an accept/connect handshake), then on
                          the intercommunicator, with the pull's own tag (mpi_mover.py):
    importer -> mover     hello    channel token (32) | u32 number of destination blocks, then u32 per block id
                                   token = HMAC(derive(key, "kv-pull/mover"), exporter nonce | importer nonce):
                                   only the two ends of this authenticated pull can compute it, so a channel
                                   that anyone else opens to the mover is never bound to a pull
    exporter -> importer  LAYER l  on TCP, no payload; then on the channel: layer l's copy_plan segments, in order

Both sides compute the same copy_plan(source ids, destination ids), so every segment is received straight into
its place in the decode pool. A mover's errors are TimeoutError (a deadline passed) or ConnectionError (the
channel broke, e.g. the peer died), which the exporter and importer already treat as a broken pull.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import threading
from typing import Protocol

from trtpd.kv.auth import NONCE_BYTES, derive_key
from trtpd.kv.errors import KvProtocolError

TOKEN_BYTES = 32
HELLO = struct.Struct("!32sI")      # token, number of destination block ids (which follow as u32s)
MAX_BLOCKS = 1 << 20


class Channel(Protocol):
    """One pull's byte channel: segments arrive in the order they were sent."""

    def send(self, buffers: list[memoryview], timeout_s: float) -> None:
        """Sends and waits (the importer's hello)."""

    def start_send(self, buffers: list[memoryview], timeout_s: float) -> None:
        """Posts one layer's segments; they go out while the caller goes on (ucx) or before it returns (mpi)."""

    def wait_sent(self, timeout_s: float) -> None:
        """Every posted segment went out (before DONE: the blocks stay the exporter's until the ACK)."""

    def start_recv(self, layers: list[list[memoryview]]) -> None:
        """Posts the receives of every layer's segments, straight into their places in the decode pool."""

    def wait_received(self, layer: int, timeout_s: float) -> None:
        """Layer `layer`'s segments are in the decode pool."""

    def release(self) -> None:
        """The pull completed (both sides moved every segment): keep the channel for the next pull."""

    def close(self) -> None:
        """The pull failed: the channel's state is unknown, so it is not used again."""


class MoverServer(Protocol):
    """The exporter's side: one per exporter, accepting channels from importers."""

    address: bytes

    def expect(self, token: bytes, sock: socket.socket) -> "PendingChannel":
        """Before ACCEPT goes out on `sock` (the pull's control socket): wait() then yields the channel."""

    def forget(self, pending: "PendingChannel") -> None: ...

    def close(self) -> None: ...


class MoverClient(Protocol):
    """The importer's side: opens one channel per pull."""

    def connect(self, host: str, address: bytes, hello: bytes, timeout_s: float, sock: socket.socket) -> Channel:
        """After ACCEPT came on `sock`: opens (or reuses) a channel to `address` and sends the hello on it."""

    def close(self) -> None: ...


MOVER_TRANSPORTS = ("ucx", "mpi")


def server_for(transport: str) -> MoverServer:
    if transport == "ucx":
        from trtpd.kv.ucx_mover import UcxServer
        return UcxServer()
    from trtpd.kv.mpi_mover import MpiServer
    return MpiServer()


def client_for(transport: str) -> MoverClient:
    if transport == "ucx":
        from trtpd.kv.ucx_mover import UcxClient
        return UcxClient()
    from trtpd.kv.mpi_mover import MpiClient
    return MpiClient()


def channel_token(key: bytes, exporter_nonce: bytes, importer_nonce: bytes) -> bytes:
    if len(exporter_nonce) != NONCE_BYTES or len(importer_nonce) != NONCE_BYTES:
        raise ValueError(f"KV pull nonces must be {NONCE_BYTES} bytes")
    return hmac.new(derive_key(key, "kv-pull/mover"), exporter_nonce + importer_nonce, hashlib.sha256).digest()


def pack_accept(address: bytes, src_block_ids: list[int]) -> bytes:
    return struct.pack("!H", len(address)) + address + struct.pack(f"!{len(src_block_ids)}I", *src_block_ids)


def unpack_accept(payload: bytes) -> tuple[bytes, list[int]]:
    if len(payload) < 2:
        raise KvProtocolError(f"malformed mover ACCEPT payload ({len(payload)} bytes)")
    (length,) = struct.unpack("!H", payload[:2])
    rest = payload[2 + length:]
    if len(payload) < 2 + length or len(rest) % 4:
        raise KvProtocolError(f"malformed mover ACCEPT payload ({len(payload)} bytes)")
    return payload[2:2 + length], list(struct.unpack(f"!{len(rest) // 4}I", rest))


def pack_hello(token: bytes, dst_block_ids: list[int]) -> bytes:
    return HELLO.pack(token, len(dst_block_ids)) + struct.pack(f"!{len(dst_block_ids)}I", *dst_block_ids)


def unpack_hello_head(head: bytes) -> tuple[bytes, int]:
    token, num_blocks = HELLO.unpack(head)
    if num_blocks > MAX_BLOCKS:
        raise KvProtocolError(f"mover hello announces {num_blocks} blocks")
    return token, num_blocks


def unpack_block_ids(data: bytes) -> list[int]:
    return list(struct.unpack(f"!{len(data) // 4}I", data))


class PendingChannel:
    """A pull waiting for its importer's channel: the mover's accept side calls bind(), the session wait()."""

    def __init__(self, token: bytes) -> None:
        self.token = token
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._is_cancelled = False
        self.channel: Channel | None = None
        self.dst_block_ids: list[int] = []

    def bind(self, channel: Channel, dst_block_ids: list[int]) -> bool:
        """False if the session gave up waiting: the caller then closes the channel."""
        with self._lock:
            if self._is_cancelled:
                return False
            self.channel, self.dst_block_ids = channel, dst_block_ids
        self._done.set()
        return True

    def wait(self, timeout_s: float) -> tuple[Channel, list[int]]:
        if not self._done.wait(timeout_s):
            with self._lock:
                self._is_cancelled = True
                if self.channel is None:
                    raise TimeoutError("the decode side did not open its KV channel in time")
        return self.channel, self.dst_block_ids


class PendingTable:
    """Pulls waiting for their channel, by token (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[bytes, PendingChannel] = {}

    def expect(self, token: bytes) -> PendingChannel:
        pending = PendingChannel(token)
        with self._lock:
            self._pending[token] = pending
        return pending

    def take(self, token: bytes) -> PendingChannel | None:
        with self._lock:
            return self._pending.pop(token, None)

    def forget(self, pending: PendingChannel) -> None:
        with self._lock:
            if self._pending.get(pending.token) is pending:
                del self._pending[pending.token]
