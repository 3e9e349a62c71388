"""KV bytes over UCX (ucxx's asyncio API), for the `ucx` transport; mover.py has the protocol.

Every ucxx call of a process runs on one event loop on a thread of its own (UcxLoop), so the exporter's
session threads and the importer's pull threads stay synchronous: they submit a coroutine and wait for it
with the pull's deadline. The exporter listens on one UCX port (all interfaces; ACCEPT names the port, the
handle's host is the address). A pull sends its hello on an endpoint to that port, which binds it to the pull;
endpoints of pulls that completed are kept and reused by the next pull between the same two processes.

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
import socket
import threading
import time
from typing import Callable

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
        return self.result(self.submit(coro), timeout_s)

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def result(self, future: concurrent.futures.Future, timeout_s: float):
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
    """One UCX endpoint. After a pull that completed it is released (kept for the next pull between the same
    two processes: an endpoint costs tens of ms to set up); after any failure it is closed."""

    def __init__(self, loop: UcxLoop, endpoint, on_release: Callable[["UcxChannel"], None] | None = None) -> None:
        self._loop, self._endpoint, self._on_release = loop, endpoint, on_release
        self.is_closed = False
        self._sends: list[concurrent.futures.Future] = []
        self._received: list[threading.Event] = []
        self._receiving: concurrent.futures.Future | None = None

    # Each call below is one hop to the loop thread: in a busy role model a hop waits for the GIL (up to the
    # 5 ms switch interval), so sends are posted without waiting and all receives are posted at once.

    def send(self, buffers: list[memoryview], timeout_s: float) -> None:
        self._loop.run(self._send(buffers), timeout_s)

    def start_send(self, buffers: list[memoryview], timeout_s: float = 0.0) -> None:
        self._sends.append(self._loop.submit(self._send(buffers)))

    def wait_sent(self, timeout_s: float) -> None:
        sends, self._sends = self._sends, []
        deadline_s = time.monotonic() + timeout_s
        for future in sends:
            self._loop.result(future, deadline_s - time.monotonic())

    def start_recv(self, layers: list[list[memoryview]]) -> None:
        self._received = [threading.Event() for _ in layers]
        self._receiving = self._loop.submit(self._recv(layers))

    def wait_received(self, layer: int, timeout_s: float) -> None:
        deadline_s = time.monotonic() + timeout_s
        while not self._received[layer].wait(min(max(deadline_s - time.monotonic(), 0.0), 0.05)):
            if self._receiving.done():    # failed: raise its error
                self._loop.result(self._receiving, 0.0)
            if time.monotonic() >= deadline_s:
                raise TimeoutError(f"UCX: layer {layer} did not arrive in time")

    async def _send(self, buffers: list[memoryview]) -> None:
        await asyncio.gather(*[self._endpoint.send(b) for b in buffers if len(b)])

    async def _recv(self, layers: list[list[memoryview]]) -> None:
        tasks = [[asyncio.ensure_future(self._endpoint.recv(b)) for b in buffers if len(b)] for buffers in layers]
        try:
            for layer, received in enumerate(tasks):
                await asyncio.gather(*received)
                self._received[layer].set()
        finally:
            for task in (t for received in tasks for t in received):
                task.cancel()

    def release(self) -> None:
        if self._on_release is None:
            self.close()
        else:
            self._on_release(self)

    def close(self) -> None:
        self.is_closed = True
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
        """Serves one importer's endpoint: a hello binds it to a pull; once that pull is released, the next
        hello may come on the same endpoint. A first hello must come within HELLO_TIMEOUT_S."""
        hello_timeout_s: float | None = HELLO_TIMEOUT_S
        try:
            while True:
                head = np.empty(HELLO.size, np.uint8)
                await asyncio.wait_for(endpoint.recv(head), hello_timeout_s)
                token, num_blocks = unpack_hello_head(head.tobytes())
                ids = np.empty(4 * num_blocks, np.uint8)
                if num_blocks:
                    await asyncio.wait_for(endpoint.recv(ids), HELLO_TIMEOUT_S)
                pending = self._table.take(token)
                if pending is None:
                    break          # no pull of this exporter waits for it (a stranger, a pull that gave up)
                released = asyncio.Event()
                channel = UcxChannel(self._loop, endpoint,
                                     on_release=lambda _: self._loop.loop.call_soon_threadsafe(released.set))
                if not pending.bind(channel, unpack_block_ids(ids.tobytes())):
                    break
                await released.wait()      # closed instead (a failed pull): the next recv fails and ends this
                if channel.is_closed:
                    return
                hello_timeout_s = None
        except (self._loop.error, asyncio.TimeoutError, KvProtocolError):
            pass
        try:
            await endpoint.close()
        except self._loop.error:
            pass

    def expect(self, token: bytes, sock: socket.socket | None = None) -> PendingChannel:
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
    """Opens endpoints to exporters and keeps the released ones, per exporter address, for later pulls."""

    def __init__(self) -> None:
        self._loop = UcxLoop.get()
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[UcxChannel]] = {}

    def connect(self, host: str, address: bytes, hello: bytes, timeout_s: float,
                sock: socket.socket | None = None) -> UcxChannel:
        try:
            where = (host, int(address))
        except ValueError:
            raise KvProtocolError(f"the exporter's UCX address {address!r} is not a port") from None
        with self._lock:
            idle = self._idle.get(where)
            channel = idle.pop() if idle else None
        if channel is None:
            endpoint = self._loop.run(self._loop.ucxx.create_endpoint(*where), timeout_s)
            channel = UcxChannel(self._loop, endpoint, on_release=lambda c: self._keep(where, c))
        try:
            channel.send([memoryview(hello[:HELLO.size]), memoryview(hello[HELLO.size:])], timeout_s)
        except (TimeoutError, ConnectionError):
            channel.close()
            raise
        return channel

    def _keep(self, where: tuple[str, int], channel: UcxChannel) -> None:
        with self._lock:
            self._idle.setdefault(where, []).append(channel)

    def close(self) -> None:
        with self._lock:
            channels = [c for idle in self._idle.values() for c in idle]
            self._idle = {}
        for channel in channels:
            channel.close()
