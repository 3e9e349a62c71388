"""The wire format between a KV importer (decode side) and a KV exporter (prefill side), and socket helpers.

Every message is a 16-byte header (network byte order, struct "!4sBBHQ") and `payload_bytes` of payload:
    magic          4 bytes  b"TKV2"
    kind           1 byte   PULL=1 ACCEPT=2 LAYER=3 DONE=4 ACK=5 CONFIRM=6 ERROR=7 HELLO=8 RELEASE=9
    code           1 byte   ERROR: an ErrorCode; otherwise 0
    layer          2 bytes  LAYER: the layer index; otherwise 0
    payload_bytes  8 bytes

One pull, one TCP connection (auth.py defines the proofs; the key is the deployment's KV key):
    exporter -> importer  HELLO     payload: the exporter's nonce (32 random bytes, fresh per connection)
    importer -> exporter  PULL      payload: proof (32) | importer nonce (32) | the signed handle (as encode()
                                    made it); the exporter checks the proof before it reads the handle, and
                                    answers ERROR UNAUTHENTICATED if it does not verify
    exporter -> importer  ACCEPT    payload: the exporter's proof (32), then tcp: nothing; shm: the segment's
                                    identity (36 bytes, shm_source.py), then one u32 block id per block
    exporter -> importer  LAYER l   for l = 0..L-1 in order, each as soon as prefill marks layer l ready.
                                    payload: tcp: the layer's valid K/V bytes in spans.py order, exactly
                                    num_tokens x 2 x kv_heads x head_size x dtype bytes; shm: none (the
                                    importer copies them out of the mapped pool)
    exporter -> importer  DONE      payload: 8 bytes, the first token (i64)
    importer -> exporter  ACK       every byte is in the decode pool
    exporter -> importer  CONFIRM   the ACK came before any timeout or failure; only now is the pull good
An ERROR (payload: a UTF-8 message) may replace any exporter message; the exporter then closes.

A decode side that will never pull a handle (its request was cancelled, or failed, before the pull) gives it
up on a connection of its own, so prefill frees the blocks now instead of at the export's deadline:
    exporter -> importer  HELLO     as above
    importer -> exporter  RELEASE   payload: as PULL's, with a proof of its own (auth.pack_release)
    exporter -> importer  CONFIRM   payload: what became of the export, b"released", b"pulling" (a pull is
                                    attached: it releases the export itself) or b"gone"
An orchestrator whose client left while prefill's answer (the handle) was on its way gives the request up by
its id: the RELEASE's "handle" is GIVE_UP_REQUEST + the request id (still under the key's proof); the exporter
releases that request's exports and exports nothing for it later (CONFIRM b"released", b"pulling", b"noted").

So a tcp pull moves layout.bytes_for(num_tokens) + 16 x (num_layers + 4) + 32 + 32 + 8 bytes from exporter
to importer, and 16 + 64 + len(handle) + 16 bytes back. A shm pull sends the same headers and proofs plus
36 + 4 x num_blocks bytes of ACCEPT payload on the socket, and the KV bytes through shared memory.
"""

from __future__ import annotations

import enum

GIVE_UP_REQUEST = b"TRTPD-GIVE-UP-REQUEST\x00"   # a RELEASE by request id instead of by handle
import select
import socket
import struct
from typing import NamedTuple

from trtpd.kv.errors import KvProtocolError

HEADER = struct.Struct("!4sBBHQ")
HEADER_BYTES = HEADER.size   # 16
MAGIC = b"TKV2"          # TKV1 (no key proof) peers are refused at the first header
MAX_IOV = 512                # buffers per sendmsg/recvmsg_into call, below Linux IOV_MAX (1024)


class Kind(enum.IntEnum):
    PULL = 1
    ACCEPT = 2
    LAYER = 3
    DONE = 4
    ACK = 5
    CONFIRM = 6
    ERROR = 7
    HELLO = 8
    RELEASE = 9


class ErrorCode(enum.IntEnum):
    NOT_FOUND = 1
    PREFILL_FAILED = 2
    TIMED_OUT = 3
    FORGED = 4
    EXPIRED = 5
    MALFORMED = 6
    BUSY = 7
    LAYOUT = 8
    CLOSING = 9
    UNAUTHENTICATED = 10   # the puller did not prove it holds the deployment key


class Frame(NamedTuple):
    kind: Kind
    code: int
    layer: int
    payload_bytes: int


def pack_header(kind: Kind, payload_bytes: int = 0, code: int = 0, layer: int = 0) -> bytes:
    return HEADER.pack(MAGIC, kind, code, layer, payload_bytes)


def unpack_header(data: bytes) -> Frame:
    magic, kind, code, layer, payload_bytes = HEADER.unpack(data)
    if magic != MAGIC or kind not in Kind._value2member_map_:
        raise KvProtocolError(f"peer sent {data!r}, not a trtpd KV frame (magic {MAGIC!r}); is the endpoint a "
                              f"trtpd KV exporter of the same version?")
    return Frame(Kind(kind), code, layer, payload_bytes)


def send_frame(sock: socket.socket, kind: Kind, payload: bytes = b"", code: int = 0, layer: int = 0) -> int:
    data = pack_header(kind, len(payload), code, layer) + payload
    sock.sendall(data)
    return len(data)


def recv_exact(sock: socket.socket, num_bytes: int) -> bytes:
    buf = bytearray(num_bytes)
    recv_into_buffers(sock, [memoryview(buf)])
    return bytes(buf)


def recv_frame(sock: socket.socket, max_payload_bytes: int) -> tuple[Frame, bytes]:
    """Reads a header and its payload (for messages whose payload is small)."""
    frame = unpack_header(recv_exact(sock, HEADER_BYTES))
    if frame.payload_bytes > max_payload_bytes:
        raise KvProtocolError(f"{frame.kind.name} frame announces {frame.payload_bytes} payload bytes, more than "
                              f"the {max_payload_bytes} it may carry")
    return frame, recv_exact(sock, frame.payload_bytes)


def send_buffers(sock: socket.socket, buffers: list[memoryview]) -> int:
    """Sends the buffers in order straight from their memory (sendmsg gather); returns the byte count."""
    pending = [b for b in buffers if len(b)]
    total = sum(len(b) for b in pending)
    i = 0
    while i < len(pending):
        sent = sock.sendmsg(pending[i:i + MAX_IOV])
        while sent:
            if sent >= len(pending[i]):
                sent -= len(pending[i])
                i += 1
            else:
                pending[i] = pending[i][sent:]
                sent = 0
    return total


def recv_into_buffers(sock: socket.socket, buffers: list[memoryview]) -> int:
    """Fills the buffers in order straight from the socket (recvmsg_into scatter); returns the byte count."""
    pending = [b for b in buffers if len(b)]
    total = sum(len(b) for b in pending)
    i = 0
    while i < len(pending):
        got = sock.recvmsg_into(pending[i:i + MAX_IOV])[0]
        if got == 0:
            raise ConnectionError(f"peer closed the connection with {sum(len(b) for b in pending[i:])} bytes "
                                  f"still expected")
        while got:
            if got >= len(pending[i]):
                got -= len(pending[i])
                i += 1
            else:
                pending[i] = pending[i][got:]
                got = 0
    return total


def peer_gone(sock: socket.socket | None) -> str | None:
    """Why the peer of `sock` is gone (it closed or reset the connection), or None while it is there.

    For a side that expects nothing from its peer just now (an exporter between PULL and ACK, a mover waiting
    on its channel): a readable socket then means EOF or an error. Bytes the peer did send stay unread (peeked)
    for the protocol to judge. poll(), not select(): a busy server's descriptors may pass FD_SETSIZE."""
    if sock is None:
        return None
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI)
        if not poller.poll(0):
            return None
        return None if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) else "the peer closed the connection"
    except BlockingIOError:
        return None
    except (OSError, ValueError) as e:
        return f"the peer's connection failed ({e})"
