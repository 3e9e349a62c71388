"""KV bytes over UCX (ucxx's asyncio API), for the `ucx` transport; mover.py has the protocol.

Every ucxx call of a process runs on one event loop on a thread of its own (UcxLoop), so the exporter's
session threads and the importer's pull threads stay synchronous: they submit a coroutine and wait for it
with the pull's deadline. The exporter listens on one UCX port (all interfaces; ACCEPT names the port, the
handle's host is the address); each pull opens its own endpoint, bound to its pull by the hello's token.

UCX settings (set unless the environment already has them, before ucxx is first imported):
    UCX_RNDV_FRAG_MEM_TYPE=host    ucxx's default (cuda) needs a GPU for rendezvous fragments
    UCXPY_PROGRESS_MODE=blocking   progress on an epoll wake-up: an idle role model costs no CPU ("polling"
                                   busy-waits a core, "thread" costs ~7% of one)
    UCX_WARN_UNUSED_ENV_VARS=n     no warning about UCX_MEMTYPE_CACHE, which ucxx sets
The pull's own ACK/CONFIRM on TCP is the final acknowledgement: no endpoint closes before the last byte arrived.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading

import numpy as np

from trtpd.kv.errors import KvProtocolError
from trtpd.kv.mover import HELLO, PendingChannel, PendingTable, unpack_block_ids, unpack_hello_head

UCX_DEFAULTS = {"UCX_RNDV_FRAG_MEM_TYPE": "host", "UCXPY_PROGRESS_MODE": "blocking", "UCX_WARN_UNUSED_ENV_VARS": "n"}
HELLO_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0


def import_ucxx():
    for name, value in UCX_DEFAULTS.items():
        os.environ.setdefault(name, value)
    try:
        import ucxx
    except ImportError:
        raise ConnectionError("the ucx KV transport needs ucxx: install trtpd's dependencies (scripts/setup.sh "
                              "installs ucxx-cu12), or use --kv-transport shm or tcp") from None
    return ucxx


class UcxLoop:
    """The process's one event loop for ucxx, on a daemon thread."""

    _instance: "UcxLoop | None" = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self.ucxx = import_ucxx()
        from ucxx.exceptions import UCXError
        self.error = UCXError
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kv-ucx-loop", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> "UcxLoop":
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def run(self, coro, timeout_s: float):
        """Runs `coro` on the loop; raises TimeoutError past `timeout_s`, ConnectionError if UCX fails."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=max(timeout_s, 0.001))
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"UCX operation timed out after {timeout_s:.3g} s") from None
        except self.error as e:
            raise ConnectionError(f"UCX: {type(e).__name__}: {e}") from None
        except concurrent.futures.CancelledError:
            raise ConnectionError("UCX operation cancelled (the channel closed)") from None


class UcxChannel:
    def __init__(self, loop: UcxLoop, endpoint) -> None:
        self._loop, self._endpoint = loop, endpoint

    def send(self, buffers: list[memoryview], timeout_s: float) -> None:
        self._loop.run(self._send(buffers), timeout_s)

    def recv(self, buffers: list[memoryview], timeout_s: float) -> None:
        self._loop.run(self._recv(buffers), timeout_s)

    async def _send(self, buffers: list[memoryview]) -> None:
        for buffer in buffers:
            if len(buffer):
                await self._endpoint.send(buffer)

    async def _recv(self, buffers: list[memoryview]) -> None:
        for buffer in buffers:
            if len(buffer):
                await self._endpoint.recv(buffer)

    def close(self) -> None:
        try:
            self._loop.run(self._endpoint.close(), CLOSE_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            pass


class UcxServer:
    """The exporter's UCX listener; binds each incoming endpoint to the pull whose token its hello carries."""

    def __init__(self) -> None:
        self._loop = UcxLoop.get()
        self._table = PendingTable()
        self._listener = self._loop.run(self._listen(), 30.0)
        self.address = str(self._listener.port).encode()

    async def _listen(self):
        return self._loop.ucxx.create_listener(self._on_endpoint, 0)

    async def _on_endpoint(self, endpoint) -> None:
        try:
            head = np.empty(HELLO.size, np.uint8)
            await asyncio.wait_for(endpoint.recv(head), HELLO_TIMEOUT_S)
            token, num_blocks = unpack_hello_head(head.tobytes())
            pending = self._table.take(token)
            if pending is not None:
                ids = np.empty(4 * num_blocks, np.uint8)
                if num_blocks:
                    await asyncio.wait_for(endpoint.recv(ids), HELLO_TIMEOUT_S)
                if pending.bind(UcxChannel(self._loop, endpoint), unpack_block_ids(ids.tobytes())):
                    return
        except (self._loop.error, asyncio.TimeoutError, KvProtocolError):
            pass
        try:   # no pull of this exporter is waiting for it (a stranger, a pull that gave up)
            await endpoint.close()
        except self._loop.error:
            pass

    def expect(self, token: bytes) -> PendingChannel:
        return self._table.expect(token)

    def forget(self, pending: PendingChannel) -> None:
        self._table.forget(pending)

    def close(self) -> None:
        try:
            self._loop.run(self._close(), CLOSE_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            pass

    async def _close(self) -> None:
        self._listener.close()


class UcxClient:
    def __init__(self) -> None:
        self._loop = UcxLoop.get()

    def connect(self, host: str, address: bytes, hello: bytes, timeout_s: float) -> UcxChannel:
        try:
            port = int(address)
        except ValueError:
            raise KvProtocolError(f"the exporter's UCX address {address!r} is not a port") from None
        endpoint = self._loop.run(self._loop.ucxx.create_endpoint(host, port), timeout_s)
        channel = UcxChannel(self._loop, endpoint)
        try:
            channel.send([memoryview(hello[:HELLO.size]), memoryview(hello[HELLO.size:])], timeout_s)
        except (TimeoutError, ConnectionError):
            channel.close()
            raise
        return channel

    def close(self) -> None:
        pass
