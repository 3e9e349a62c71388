"""The prefill side of the KV transfer: keeps each request's KV blocks until a decode instance has pulled them.

The prefill engine thread calls register() when a batch is scheduled, mark_layers_ready() after each layer,
complete() with the first token (or fail(), or discard() when that token ended the request), and frees the blocks
of the ids drain_released() returns.
The exporter serves pulls on its own threads: one accepts connections, one per pull streams layers as they
become ready (frame.py describes the protocol; for ucx and mpi the bytes go on a
channel of the transport's own, mover.py), and a reaper releases exports whose deadline passed
(transfer_timeout_s after register(), renewed by complete()), so KV is never held forever. A decode side
that will never pull a handle gives it up (a RELEASE, frame.py): its blocks are released at once.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from typing import Callable

from trtpd.kv import auth, frame, mover
from trtpd.kv.endpoint import TRANSPORTS, KvEndpoint
from trtpd.kv.errors import (KvExportNotFoundError, KvHandleExpiredError, KvHandleForgedError, KvHandleError,
                             KvProtocolError)
from trtpd.kv.export_table import Abort, Export, ExportCounters, ExportTable
from trtpd.kv.frame import GIVE_UP_REQUEST, ErrorCode, Kind
from trtpd.kv.handle import HANDLE_VERSION, MAX_HANDLE_BYTES, ContextPhaseParams, check_key, decode, encode
from trtpd.kv.pool import SHM_DIR, KvPool
from trtpd.kv.shm_source import ShmPoolIdentity
from trtpd.kv.spans import check_blocks, copy_plan, layer_stride_bytes, pool_bytes, request_spans
from trtpd.errors import ConfigError

PULL_REQUEST_TIMEOUT_S = 10.0    # a connection must send its PULL within this
SOCKET_BUFFER_BYTES = 4 << 20
CLOSE_GRACE_S = 1.0              # close() lets sessions send their ERROR this long before cutting them off
CHANNEL_TIMEOUT_S = 10.0         # ucx, mpi: the importer must open its byte channel within this after ACCEPT


class KvExporter:
    def __init__(self, pool: KvPool, key: bytes, transport: str = "shm", host: str = "127.0.0.1", port: int = 0,
                 transfer_timeout_s: float = 30.0, wakeup: Callable[[], None] | None = None,
                 advertise_host: str = "") -> None:
        if transport not in TRANSPORTS:
            raise ConfigError(f"KV transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
        if transport == "shm" and pool.shm_name is None:
            raise ConfigError("KV transport 'shm' needs the prefill pool in shared memory: create it with "
                              "KvPool(..., shm_name=...), or use transport 'tcp'")
        if transfer_timeout_s <= 0:
            raise ConfigError(f"transfer_timeout_s must be positive, got {transfer_timeout_s}")
        check_key(key)
        if transport == "shm":
            # The segment is the pool itself: only this uid may map it (KvPool creates it 0600). A decode
            # instance of another uid cannot open it, whatever handle it holds; refuse a pool others can read.
            mode = os.stat(SHM_DIR / pool.shm_name).st_mode & 0o777
            if mode & 0o077:
                raise ConfigError(f"KV pool segment {SHM_DIR / pool.shm_name} has mode {mode:04o}: other users "
                                  f"could read or write the KV cache; it must be 0600 (create it with KvPool)")
        self.pool = pool
        self.transport = transport
        self.transfer_timeout_s = transfer_timeout_s
        self._key = key
        self._pool_view = memoryview(pool_bytes(pool))
        self._layer_stride_bytes = layer_stride_bytes(pool.layout, pool.num_blocks)
        self._table = ExportTable(pool.layout.num_layers, on_release=wakeup)
        self._listener = socket.create_server((host, port))
        # handles name `advertise_host` (where decode reaches us) when the bind address is not that
        self._endpoint = KvEndpoint(transport, advertise_host or host, self._listener.getsockname()[1], pool.shm_name)
        self._shm_identity = ShmPoolIdentity.of(pool.shm_name, pool.num_blocks) if transport == "shm" else None
        self._mover = mover.server_for(transport) if transport in mover.MOVER_TRANSPORTS else None
        self._sessions: dict[socket.socket, threading.Thread] = {}
        self._sessions_lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept_loop, name="kv-export-accept", daemon=True),
                         threading.Thread(target=self._table.reap_until_closed, name="kv-export-reaper", daemon=True)]
        for thread in self._threads:
            thread.start()

    # engine-thread API

    @property
    def endpoint(self) -> str:
        return str(self._endpoint)

    def register(self, request_id: str, block_ids: list[int], num_tokens: int) -> bytes:
        """Starts an export before any layer is computed; returns a signed handle without a first token."""
        check_blocks(self.pool.layout, self.pool.num_blocks, block_ids, num_tokens, f"request {request_id!r}")
        export = self._table.add(request_id, block_ids, num_tokens, self.transfer_timeout_s, time.time())
        return self._sign(export, None)

    def mark_layers_ready(self, request_ids: list[str], layer: int) -> None:
        """Layers 0..layer of these requests are written. Ids no longer exported (timed out, failed) are skipped."""
        self._table.mark_ready(request_ids, layer)

    def complete(self, request_id: str, first_token: int) -> bytes:
        """All layers are written and the first token is known; returns the signed handle that carries it."""
        try:
            export = self._table.complete(request_id, first_token)
        except KeyError as e:
            raise KvExportNotFoundError(
                f"cannot complete the KV export of request {request_id!r}: {e.args[0]}; its KV is gone, fail the "
                f"request (or raise transfer_timeout_s, now {self.transfer_timeout_s:g} s)") from None
        return self._sign(export, first_token)

    def fail(self, request_id: str, reason: str) -> None:
        self._table.fail(request_id, reason)

    def discard(self, request_id: str, why: str) -> None:
        """The request ended at its first token: no decode will pull its KV, which is released now (as TensorRT-LLM
        terminates a request its context phase finished and frees its KV without sending it)."""
        self._table.discard(request_id, why)

    def drain_released(self) -> list[str]:
        """Ids whose blocks the engine may free. An id can come back (timeout, fail) while its prefill batch
        still runs: free its blocks once the batch is done too."""
        return self._table.drain_released()

    @property
    def wakeup(self) -> Callable[[], None] | None:
        """Called (from any thread, no lock held) whenever drain_released() has something new."""
        return self._table.on_release

    @wakeup.setter
    def wakeup(self, callback: Callable[[], None] | None) -> None:
        self._table.on_release = callback

    @property
    def num_pending(self) -> int:
        with self._table.cond:
            return len(self._table.exports)

    @property
    def counters(self) -> ExportCounters:
        with self._table.cond:
            return dataclasses.replace(self._table.counters)

    @property
    def bytes_sent(self) -> int:
        return self.counters.bytes_sent

    @property
    def num_pulls(self) -> int:
        return self.counters.num_pulls

    @property
    def num_given_up(self) -> int:
        return self.counters.num_given_up

    @property
    def num_timeouts(self) -> int:
        return self.counters.num_timeouts

    def close(self) -> None:
        self._table.close(f"the prefill KV exporter at {self.endpoint} is shutting down")
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._threads[0].join(timeout=5.0)     # the accept loop: no new sessions after this
        with self._sessions_lock:
            sessions = dict(self._sessions)
        deadline_s = time.monotonic() + CLOSE_GRACE_S     # sessions waiting for layers send ERROR and end
        for thread in sessions.values():
            thread.join(timeout=max(deadline_s - time.monotonic(), 0.0))
        for sock, thread in sessions.items():             # sessions still blocked in socket I/O
            if thread.is_alive():
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for thread in [*self._threads, *sessions.values()]:
            thread.join(timeout=5.0)   # after this no thread reads the pool: the caller may close it
        if self._mover is not None:
            self._mover.close()
        self._pool_view = memoryview(b"")

    def _sign(self, export: Export, first_token: int | None) -> bytes:
        now_s = time.time()
        expires_at_s = now_s + max(export.deadline_s - time.monotonic(), 0.0)
        params = ContextPhaseParams(HANDLE_VERSION, self.endpoint, export.request_id, self.pool.layout,
                                    export.num_tokens, first_token, now_s, expires_at_s)
        return encode(params, self._key)

    # serving threads

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return      # closed
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            session = threading.Thread(target=self._serve, args=(sock,), name="kv-export-pull", daemon=True)
            with self._sessions_lock:
                self._sessions[sock] = session
            session.start()

    def _serve(self, sock: socket.socket) -> None:
        export, why, pending, channel = None, "pull connection broke", None, None
        try:
            sock.settimeout(PULL_REQUEST_TIMEOUT_S)
            nonce = auth.new_nonce()       # the challenge: fresh per connection, so no proof can be replayed
            frame.send_frame(sock, Kind.HELLO, nonce)
            request, payload = frame.recv_frame(sock, MAX_HANDLE_BYTES + auth.PROOF_BYTES + auth.NONCE_BYTES)
            if request.kind == Kind.RELEASE:
                self._give_up(sock, nonce, payload)
                return
            if request.kind != Kind.PULL:
                raise KvProtocolError(f"expected a PULL frame, got {request.kind.name}")
            try:   # before the handle is even parsed: without the key, a handle gives nothing
                importer_nonce, blob = auth.unpack_pull(self._key, nonce, payload)
            except auth.KvPeerAuthError as e:
                raise Abort(ErrorCode.UNAUTHENTICATED, f"{self.endpoint} refused the pull: {e}") from None
            params = self._verify(blob)
            export = self._table.attach(params.request_id, params.issued_at_s)
            accept = auth.exporter_proof(self._key, nonce, importer_nonce, blob)
            if self._shm_identity:
                accept += self._shm_identity.pack_accept(export.block_ids)
            elif self._mover is not None:
                pending = self._mover.expect(mover.channel_token(self._key, nonce, importer_nonce), sock)
                accept += mover.pack_accept(self._mover.address, export.block_ids)
            frame.send_frame(sock, Kind.ACCEPT, accept)
            plan = None
            if pending is not None:
                channel, dst_block_ids = pending.wait(min(self._remaining_s(export), CHANNEL_TIMEOUT_S))
                plan = self._channel_plan(export, dst_block_ids)
            self._send_layers(sock, export, channel, plan)
            first_token = self._table.wait_first_token(export, peer_gone=lambda: frame.peer_gone(sock))
            frame.send_frame(sock, Kind.DONE, first_token.to_bytes(8, "big", signed=True))
            sock.settimeout(self._remaining_s(export))
            try:
                reply, _ = frame.recv_frame(sock, 0)
            except socket.timeout:
                raise export.abort or Abort(ErrorCode.TIMED_OUT, "timed out waiting for the decode side's ACK")
            if reply.kind != Kind.ACK:
                raise KvProtocolError(f"expected an ACK frame, got {reply.kind.name}")
            self._table.ack(export, self.pool.layout.bytes_for(export.num_tokens))
            why = "pulled"
            frame.send_frame(sock, Kind.CONFIRM)
        except Abort as abort:
            why = abort.message
            if export is None:
                self._table.count_refused()
            try:
                sock.settimeout(1.0)
                frame.send_frame(sock, Kind.ERROR, abort.message.encode(), code=abort.code)
            except OSError:
                pass
        except (OSError, KvProtocolError) as e:
            why = f"pull connection broke: {e}"
        finally:
            if pending is not None:
                self._mover.forget(pending)
            if channel is not None:
                channel.release() if why == "pulled" else channel.close()
            if export is not None:
                self._table.release(export, why)
            with self._sessions_lock:
                self._sessions.pop(sock, None)
            sock.close()

    def _give_up(self, sock: socket.socket, nonce: bytes, payload: bytes) -> None:
        """A RELEASE (frame.py): the decode side will never pull this handle; its blocks are freed now."""
        try:
            blob = auth.unpack_release(self._key, nonce, payload)
        except auth.KvPeerAuthError as e:
            raise Abort(ErrorCode.UNAUTHENTICATED, f"{self.endpoint} refused the release: {e}") from None
        if blob.startswith(GIVE_UP_REQUEST):   # by request id: the orchestrator never got (or lost) the handle
            request_id = blob[len(GIVE_UP_REQUEST):].decode("utf-8", "replace")
            status = self._table.give_up_request(request_id, "its client left before the first token")
        else:
            params = self._verify(blob)
            status = self._table.give_up(params.request_id, params.issued_at_s, "its request ended before the pull")
        frame.send_frame(sock, Kind.CONFIRM, status.encode())

    def _verify(self, blob: bytes) -> ContextPhaseParams:
        try:
            params = decode(blob, self._key, time.time())
        except KvHandleForgedError as e:
            raise Abort(ErrorCode.FORGED, str(e)) from None
        except KvHandleExpiredError as e:
            raise Abort(ErrorCode.EXPIRED, str(e)) from None
        except KvHandleError as e:
            raise Abort(ErrorCode.MALFORMED, str(e)) from None
        if params.endpoint != self.endpoint:
            raise Abort(ErrorCode.NOT_FOUND, f"the handle was issued by {params.endpoint}, not by this exporter")
        problems = params.layout.mismatches(self.pool.layout, "handle", "prefill pool")
        if problems:
            raise Abort(ErrorCode.LAYOUT, "; ".join(problems))
        return params

    def _channel_plan(self, export: Export, dst_block_ids: list[int]) -> list[tuple[int, int, int]]:
        try:
            check_blocks(self.pool.layout, 1 << 31, dst_block_ids, export.num_tokens, "the importer's hello")
        except ValueError as e:
            raise KvProtocolError(str(e)) from None
        return copy_plan(self.pool.layout, export.block_ids, dst_block_ids, export.num_tokens)

    def _send_layers(self, sock: socket.socket, export: Export, channel: mover.Channel | None = None,
                     plan: list[tuple[int, int, int]] | None = None) -> None:
        spans = request_spans(self.pool.layout, export.block_ids, export.num_tokens)
        payload_bytes = sum(size for _, size in spans) if self.transport == "tcp" else 0
        num_sent = 0
        while num_sent < self.pool.layout.num_layers:
            num_ready = self._table.wait_layers(export, num_sent, peer_gone=lambda: frame.peer_gone(sock))
            if channel is not None:   # the header on TCP, then the layer's segments on the transport's channel
                for layer in range(num_sent, num_ready):
                    if export.abort is not None:
                        raise export.abort
                    sock.settimeout(self._remaining_s(export))
                    sock.sendall(frame.pack_header(Kind.LAYER, 0, layer=layer))
                    base = layer * self._layer_stride_bytes
                    channel.start_send([self._pool_view[base + src:base + src + size] for src, _, size in plan],
                                       self._remaining_s(export))
            elif self.transport == "shm":   # say which layers are ready; the importer copies them from the pool
                sock.settimeout(self._remaining_s(export))
                sock.sendall(b"".join(frame.pack_header(Kind.LAYER, 0, layer=layer)
                                      for layer in range(num_sent, num_ready)))
            else:
                for layer in range(num_sent, num_ready):
                    if export.abort is not None:
                        raise export.abort
                    sock.settimeout(self._remaining_s(export))
                    base = layer * self._layer_stride_bytes
                    header = frame.pack_header(Kind.LAYER, payload_bytes, layer=layer)
                    frame.send_buffers(sock, [memoryview(header)] + [
                        self._pool_view[base + offset:base + offset + size] for offset, size in spans])
            num_sent = num_ready
        if channel is not None:
            channel.wait_sent(self._remaining_s(export))

    @staticmethod
    def _remaining_s(export: Export) -> float:
        return max(export.deadline_s - time.monotonic(), 0.001)
