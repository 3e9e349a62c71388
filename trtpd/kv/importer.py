"""The decode side of the KV transfer: checks a handle, then pulls the request's KV layer by layer.

verify() refuses a forged, stale or incompatible handle before anything moves. pull() connects to the
exporter named in the handle, receives (tcp; ucx and mpi on a channel of their own, mover.py) or copies out of
the mapped prefill pool (shm) each layer as
soon as prefill has written it, waits for the first token, acknowledges, and returns only once the exporter
confirms that the acknowledgement beat any timeout. Several pulls may run at once on different threads.
"""

from __future__ import annotations

import ctypes
import socket
import time
from dataclasses import dataclass
from typing import Callable

from trtpd.kv import auth, frame, mover
from trtpd.kv.endpoint import KvEndpoint
from trtpd.kv.errors import (KvConnectError, KvExportNotFoundError, KvHandleExpiredError, KvHandleForgedError,
                             KvHandleMalformedError, KvLayoutMismatchError, KvPrefillFailedError,
                             KvProtocolError, KvTransferError, KvTransferTimeoutError)
from trtpd.kv.frame import ErrorCode, Kind
from trtpd.kv.handle import ContextPhaseParams, check_key, check_layout, decode, encode
from trtpd.kv.pool import KvPool
from trtpd.kv.shm_source import ShmPoolIdentity, ShmPoolSources
from trtpd.kv.spans import check_blocks, copy_plan, layer_stride_bytes, pool_bytes, request_spans

EXPIRY_GRACE_S = 5.0           # a pull without its own timeout gives up this long after the handle expires
MAX_CONTROL_PAYLOAD_BYTES = 64 * 1024 + 4 * (1 << 20)
SOCKET_BUFFER_BYTES = 4 << 20
GIVE_UP_TIMEOUT_S = 2.0        # telling an exporter that a handle will not be pulled: best effort, briefly


@dataclass(frozen=True)
class PullResult:
    request_id: str
    endpoint: str
    first_token: int
    bytes_moved: int                  # KV bytes written into the decode pool: layout.bytes_for(num_tokens)
    wire_bytes: int                   # bytes the exporter sent on the socket: frame headers and payloads
    seconds: float                    # connect to confirmation
    layer_done_s: tuple[float, ...]   # per layer: seconds after the pull started when it was in the decode pool
    layer_move_s: tuple[float, ...]   # per layer: seconds spent receiving or copying it (no waiting)


class KvImporter:
    def __init__(self, pool: KvPool, key: bytes, connect_timeout_s: float = 5.0) -> None:
        check_key(key)
        self.pool = pool
        self.connect_timeout_s = connect_timeout_s
        self._key = key
        self._pool_array = pool_bytes(pool)
        self._pool_view = memoryview(self._pool_array)
        self._layer_stride_bytes = layer_stride_bytes(pool.layout, pool.num_blocks)
        self._sources = ShmPoolSources()
        self._mover_clients: dict[str, mover.MoverClient] = {}

    def _mover_client(self, transport: str) -> mover.MoverClient:
        if transport not in self._mover_clients:   # (a race makes two clients, which is harmless)
            self._mover_clients[transport] = mover.client_for(transport)
        return self._mover_clients[transport]

    def verify(self, blob: bytes, now_s: float) -> ContextPhaseParams:
        """Signature, expiry and layout against this pool; raises a KvTransferError subclass, moves nothing."""
        params = decode(blob, self._key, now_s)
        check_layout(params, self.pool.layout)
        return params

    def pull(self, params: ContextPhaseParams, dst_block_ids: list[int],
             on_layer: Callable[[int], None] | None = None, timeout_s: float | None = None) -> PullResult:
        """Blocks until the request's KV is in `dst_block_ids` (block i of the request -> dst_block_ids[i])."""
        check_layout(params, self.pool.layout)
        where = f"KV pull of request {params.request_id!r} from {params.endpoint}"
        check_blocks(self.pool.layout, self.pool.num_blocks, dst_block_ids, params.num_tokens, where)
        endpoint = KvEndpoint.parse(params.endpoint)
        if timeout_s is None:
            timeout_s = max(params.expires_at_s - time.time(), 0.0) + EXPIRY_GRACE_S
        pull = _Pull(self, params, endpoint, list(dst_block_ids), where, time.monotonic() + timeout_s)
        return pull.run(on_layer)

    def give_up(self, params: ContextPhaseParams, timeout_s: float = GIVE_UP_TIMEOUT_S) -> str:
        """Tells the exporter that this handle will never be pulled (its request was cancelled or failed first), so
        prefill frees its blocks now rather than at the export's deadline. Returns what the exporter did:
        "released", "pulling" (a pull is under way: it releases them) or "gone"; raises KvTransferError
        subclasses when the exporter cannot be told (it then frees them at the deadline)."""
        return _GiveUp(self._key, params, timeout_s).run(None)

    def close(self) -> None:
        """Unmaps the prefill pools; call after the last pull has returned."""
        self._sources.close()
        for client in self._mover_clients.values():
            client.close()


def give_up_handle(handle: bytes, key: bytes, timeout_s: float = GIVE_UP_TIMEOUT_S) -> str:
    """KvImporter.give_up for a process with the deployment key but no KV pool (the gateway): the signed handle
    as prefill returned it. Raises KvTransferError subclasses (a forged or expired handle among them)."""
    params = decode(handle, key, time.time())
    return _GiveUp(key, params, timeout_s).run(None)


class _Pull:
    """One pull on one connection; raises KvTransferError subclasses that say what happened and what to do."""

    def __init__(self, importer: KvImporter, params: ContextPhaseParams, endpoint: KvEndpoint,
                 dst_block_ids: list[int], where: str, deadline_s: float) -> None:
        self.importer, self.params, self.endpoint = importer, params, endpoint
        self.dst_block_ids, self.where, self.deadline_s = dst_block_ids, where, deadline_s
        self.layout = importer.pool.layout
        self._start(importer._key, importer.connect_timeout_s)

    def _start(self, key: bytes, connect_timeout_s: float) -> None:
        self.key, self.connect_timeout_s = key, connect_timeout_s
        self.wire_bytes = 0
        self.waiting_for = "the connection"
        self.channel: mover.Channel | None = None

    def run(self, on_layer: Callable[[int], None] | None) -> PullResult:
        start_s = time.perf_counter()
        try:
            sock = socket.create_connection((self.endpoint.host, self.endpoint.port),
                                            timeout=min(self.connect_timeout_s, self._remaining_s()))
        except socket.timeout:
            raise KvTransferTimeoutError(f"{self.where}: connecting timed out; check that the prefill instance is "
                                         f"up and reachable from this host, then re-run prefill") from None
        except OSError as e:
            raise KvConnectError(f"{self.where}: cannot connect ({e.strerror or e}); check that the prefill instance "
                                 f"is up and reachable from this host, then re-run prefill for this request") from None
        with sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
            try:
                result = self._converse(sock, start_s, on_layer)
                if self.channel is not None:
                    self.channel, channel = None, self.channel
                    channel.release()
                return result
            except ValueError as e:    # a mover's hello could not be made (bad block ids from the exporter)
                raise KvProtocolError(f"{self.where}: {e}") from None
            except socket.timeout:
                raise KvTransferTimeoutError(
                    f"{self.where}: timed out waiting for {self.waiting_for}; the prefill instance may be stuck or "
                    f"overloaded; re-run prefill for this request") from None
            except OSError as e:
                raise KvConnectError(
                    f"{self.where}: the connection broke while waiting for {self.waiting_for} ({e}); the prefill "
                    f"instance may have stopped or timed the export out; re-run prefill for this request") from None
            finally:
                if self.channel is not None:
                    self.channel.close()

    def _converse(self, sock: socket.socket, start_s: float, on_layer: Callable[[int], None] | None) -> PullResult:
        key, nonce = self.key, self._challenge(sock)
        handle = encode(self.params, key)
        pull, my_nonce = auth.pack_pull(key, nonce, handle)   # proves this side holds the deployment key
        frame.send_frame(sock, Kind.PULL, pull)
        _, accept = self._expect(sock, Kind.ACCEPT, "the exporter to accept the pull")
        if len(accept) < auth.PROOF_BYTES:
            raise KvProtocolError(f"{self.where}: ACCEPT of {len(accept)} bytes carries no exporter proof")
        auth.check_exporter_proof(key, nonce, my_nonce, handle, accept[:auth.PROOF_BYTES], self.where)
        accept = accept[auth.PROOF_BYTES:]
        if self.endpoint.transport == "shm":
            move_layer = self._shm_mover(accept)
        elif self.endpoint.transport in mover.MOVER_TRANSPORTS:
            move_layer = self._channel_mover(sock, accept, mover.channel_token(key, nonce, my_nonce))
        else:
            move_layer = self._tcp_mover(sock)
        layer_done_s, layer_move_s = [], []
        for layer in range(self.layout.num_layers):
            header, _ = self._expect(sock, Kind.LAYER, f"layer {layer}", read_payload=False)
            if header.layer != layer:
                raise KvProtocolError(f"{self.where}: expected layer {layer}, the exporter sent layer {header.layer}")
            move_start_s = time.perf_counter()
            move_layer(layer, header.payload_bytes)
            done_s = time.perf_counter()
            layer_move_s.append(done_s - move_start_s)
            layer_done_s.append(done_s - start_s)
            if on_layer is not None:
                on_layer(layer)
        _, done = self._expect(sock, Kind.DONE, "the first token")
        first_token = int.from_bytes(done, "big", signed=True)
        frame.send_frame(sock, Kind.ACK)
        self._expect(sock, Kind.CONFIRM, "the exporter to confirm the acknowledgement")
        return PullResult(self.params.request_id, self.params.endpoint, first_token,
                          self.layout.bytes_for(self.params.num_tokens), self.wire_bytes,
                          time.perf_counter() - start_s, tuple(layer_done_s), tuple(layer_move_s))

    def _challenge(self, sock: socket.socket) -> bytes:
        """The exporter's HELLO: this connection's nonce."""
        sock.settimeout(self._remaining_s())
        _, nonce = self._expect(sock, Kind.HELLO, "the exporter's challenge")
        if len(nonce) != auth.NONCE_BYTES:
            raise KvProtocolError(f"{self.where}: HELLO carries {len(nonce)} bytes, not a "
                                  f"{auth.NONCE_BYTES}-byte nonce")
        return nonce

    def _tcp_mover(self, sock: socket.socket) -> Callable[[int, int], None]:
        spans = request_spans(self.layout, self.dst_block_ids, self.params.num_tokens)
        layer_bytes = sum(size for _, size in spans)
        view, stride = self.importer._pool_view, self.importer._layer_stride_bytes

        def move(layer: int, payload_bytes: int) -> None:
            if payload_bytes != layer_bytes:
                raise KvProtocolError(f"{self.where}: layer {layer} carries {payload_bytes} bytes, expected "
                                      f"{layer_bytes} for {self.params.num_tokens} tokens")
            sock.settimeout(self._remaining_s())
            base = layer * stride
            self.wire_bytes += frame.recv_into_buffers(sock, [view[base + o:base + o + n] for o, n in spans])
        return move

    def _channel_mover(self, sock: socket.socket, accept: bytes, token: bytes) -> Callable[[int, int], None]:
        address, src_block_ids = mover.unpack_accept(accept)
        if len(src_block_ids) != len(self.dst_block_ids):
            raise KvProtocolError(f"{self.where}: the exporter names {len(src_block_ids)} blocks, the request has "
                                  f"{len(self.dst_block_ids)}")
        plan = copy_plan(self.layout, src_block_ids, self.dst_block_ids, self.params.num_tokens)
        view, stride = self.importer._pool_view, self.importer._layer_stride_bytes
        if any(dst + size > stride for _, dst, size in plan):
            raise KvProtocolError(f"{self.where}: copy plan leaves the decode pool; refusing to receive")
        self.waiting_for = f"the {self.endpoint.transport} channel to open"
        client = self.importer._mover_client(self.endpoint.transport)
        self.channel = client.connect(self.endpoint.host, address, mover.pack_hello(token, self.dst_block_ids),
                                      self._remaining_s(), sock)
        self.channel.start_recv([[view[layer * stride + dst:layer * stride + dst + size] for _, dst, size in plan]
                                 for layer in range(self.layout.num_layers)])

        def move(layer: int, payload_bytes: int) -> None:
            if payload_bytes:
                raise KvProtocolError(f"{self.where}: {self.endpoint.transport} LAYER frame with {payload_bytes} "
                                      f"payload bytes")
            self.channel.wait_received(layer, self._remaining_s())
        return move

    def _shm_mover(self, accept: bytes) -> Callable[[int, int], None]:
        identity, src_block_ids = ShmPoolIdentity.unpack_accept(accept)
        src_num_blocks = identity.num_blocks
        check_blocks(self.layout, src_num_blocks, src_block_ids, self.params.num_tokens, f"{self.where} (prefill)")
        source = self.importer._sources.get(self.endpoint.shm_name, identity, self.layout, self.where)
        plan = copy_plan(self.layout, src_block_ids, self.dst_block_ids, self.params.num_tokens)
        src_stride = layer_stride_bytes(self.layout, src_num_blocks)
        dst_stride = self.importer._layer_stride_bytes
        if any(src + size > src_stride or dst + size > dst_stride for src, dst, size in plan):
            raise KvProtocolError(f"{self.where}: copy plan leaves the pools; refusing to copy")  # memmove guard
        src_address, dst_address = source.address, self.importer._pool_array.ctypes.data

        def move(layer: int, payload_bytes: int) -> None:
            if payload_bytes:
                raise KvProtocolError(f"{self.where}: shm LAYER frame with {payload_bytes} payload bytes")
            src_base, dst_base = src_address + layer * src_stride, dst_address + layer * dst_stride
            for src, dst, size in plan:
                ctypes.memmove(dst_base + dst, src_base + src, size)
        return move

    def _expect(self, sock: socket.socket, kind: Kind, what: str,
                read_payload: bool = True) -> tuple[frame.Frame, bytes]:
        self.waiting_for = what
        sock.settimeout(self._remaining_s())
        header = frame.unpack_header(frame.recv_exact(sock, frame.HEADER_BYTES))
        self.wire_bytes += frame.HEADER_BYTES
        payload = b""
        if header.kind == Kind.ERROR or read_payload:
            if header.payload_bytes > MAX_CONTROL_PAYLOAD_BYTES:
                raise KvProtocolError(f"{self.where}: {header.kind.name} frame of {header.payload_bytes} bytes")
            payload = frame.recv_exact(sock, header.payload_bytes)
            self.wire_bytes += len(payload)
        if header.kind == Kind.ERROR:
            raise self._remote_error(header.code, payload.decode(errors="replace"))
        if header.kind != kind:
            raise KvProtocolError(f"{self.where}: expected {kind.name} while waiting for {what}, "
                                  f"got {header.kind.name}")
        return header, payload

    def _remote_error(self, code: int, message: str) -> KvTransferError:
        rerun = "re-run prefill for this request"
        where = f"{self.where}: the prefill side refused"
        if code == ErrorCode.NOT_FOUND:
            return KvExportNotFoundError(f"{where}: no such export, {message}; {rerun}")
        if code == ErrorCode.PREFILL_FAILED:
            return KvPrefillFailedError(f"{where}: {message}; fail the request or retry it from prefill")
        if code == ErrorCode.TIMED_OUT:
            return KvTransferTimeoutError(f"{where}: the export {message}; {rerun}, and raise transfer_timeout_s or "
                                          f"add decode capacity if decode routinely pulls this late")
        if code == ErrorCode.FORGED:
            return KvHandleForgedError(f"{where} the handle: {message}")
        if code == ErrorCode.EXPIRED:
            return KvHandleExpiredError(f"{where} the handle: {message}")
        if code == ErrorCode.MALFORMED:
            return KvHandleMalformedError(f"{where} the handle: {message}")
        if code == ErrorCode.LAYOUT:
            return KvLayoutMismatchError(f"{where}: KV layout mismatch: {message}", message.split("; "))
        if code == ErrorCode.CLOSING:
            return KvConnectError(f"{where}: {message}; {rerun} on another prefill instance")
        if code == ErrorCode.UNAUTHENTICATED:
            return auth.KvPeerAuthError(f"{self.where}: {message}")
        if code == ErrorCode.BUSY:
            return KvTransferError(f"{where}: {message}; a handle can be pulled once, by one decode instance")
        return KvTransferError(f"{where}: error code {code}: {message}")

    def _remaining_s(self) -> float:
        remaining = self.deadline_s - time.monotonic()
        if remaining <= 0:
            raise socket.timeout()
        return remaining


class _GiveUp(_Pull):
    """A RELEASE on a connection of its own (frame.py): moves nothing, returns the exporter's answer."""

    def __init__(self, key: bytes, params: ContextPhaseParams, timeout_s: float) -> None:
        self.params, self.endpoint = params, KvEndpoint.parse(params.endpoint)
        self.where = f"giving up the KV of request {params.request_id!r} on {params.endpoint}"
        self.deadline_s = time.monotonic() + timeout_s
        self._start(key, timeout_s)        # (the connect, like the rest, within timeout_s)

    def _converse(self, sock: socket.socket, start_s: float, on_layer: Callable[[int], None] | None) -> str:
        key, nonce = self.key, self._challenge(sock)
        frame.send_frame(sock, Kind.RELEASE, auth.pack_release(key, nonce, encode(self.params, key)))
        _, status = self._expect(sock, Kind.CONFIRM, "the exporter to confirm the release")
        return status.decode(errors="replace")


def give_up_request(endpoint: str, request_id: str, key: bytes, timeout_s: float = GIVE_UP_TIMEOUT_S) -> str:
    """Gives up request `request_id` on the exporter at `endpoint` ("host:port" or a handle's endpoint) without its
    handle: for an orchestrator whose client left while prefill's answer was on its way. Returns the exporter's
    "released", "pulling" or "noted"; raises KvTransferError subclasses when it cannot be told."""
    return _GiveUpRequest(key, endpoint, request_id, timeout_s).run(None)


def give_up_best_effort(key: bytes, handle: bytes | None, endpoint: str = "", request_id: str = "") -> bool:
    """The orchestrator's give-up of a prefill export no decode will pull, for a worker thread: by its handle, or
    (no handle: the client left while prefill's answer was on its way) by the sub-request's id on `endpoint`.
    Best effort: an exporter that is gone or a handle that expired is logged, and the export's deadline frees the
    blocks. Returns whether the exporter was told."""
    try:
        if handle is not None:
            give_up_handle(handle, key)
        elif endpoint and request_id:
            give_up_request(endpoint, request_id, key)
        else:
            return False
        return True
    except Exception as exc:   # noqa: BLE001 - whatever it was, the deadline still frees the blocks
        import logging
        logging.getLogger(__name__).info("could not give up a prefill's KV (%s); it is freed at the export's "
                                         "deadline", exc)
        return False


class _GiveUpRequest(_GiveUp):
    def __init__(self, key: bytes, endpoint: str, request_id: str, timeout_s: float) -> None:
        self.endpoint = KvEndpoint.parse(endpoint if "://" in endpoint else f"tcp://{endpoint}")
        self.request_id = request_id
        self.where = f"giving up request {request_id!r} on {endpoint}"
        self.deadline_s = time.monotonic() + timeout_s
        self._start(key, timeout_s)

    def _converse(self, sock: socket.socket, start_s: float, on_layer: Callable[[int], None] | None) -> str:
        key, nonce = self.key, self._challenge(sock)
        blob = frame.GIVE_UP_REQUEST + self.request_id.encode()
        frame.send_frame(sock, Kind.RELEASE, auth.pack_release(key, nonce, blob))
        _, status = self._expect(sock, Kind.CONFIRM, "the exporter to confirm the release")
        return status.decode(errors="replace")
