"""The pull's challenge-response against a real prefill process: a handle without the key gets nothing,
a captured PULL cannot be replayed, and an endpoint without the key cannot pose as the exporter."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import torch

from trtpd.kv import auth, frame
from trtpd.kv.auth import KvPeerAuthError
from trtpd.kv.errors import KvHandleForgedError
from trtpd.kv.frame import ErrorCode, Kind
from trtpd.kv.handle import ContextPhaseParams, decode, encode, generate_key
from trtpd.kv.importer import KvImporter
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool

from tests.integration.kv.conftest import transports_under_test

pytestmark = pytest.mark.integration
TRANSPORTS = transports_under_test()
LAYOUT = KvLayout(num_layers=3, num_kv_heads=2, head_size=8, tokens_per_block=8, dtype="fp16")


def connect(endpoint: str) -> socket.socket:
    address = endpoint.split("://", 1)[1].split("/", 1)[0]
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.settimeout(10)
    return sock


def hello(sock: socket.socket) -> bytes:
    header, nonce = frame.recv_frame(sock, 1024)
    assert header.kind == Kind.HELLO and len(nonce) == auth.NONCE_BYTES
    return nonce


def answer(sock: socket.socket) -> tuple[frame.Frame, bytes]:
    return frame.recv_frame(sock, 1 << 20)


def filled(pool: KvPool, value: int) -> KvPool:
    np.copyto(pool.data.view(torch.uint8).numpy(), value)
    return pool


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_valid_handle_without_the_key_is_refused_and_the_owner_still_pulls(exporters, transport):
    exporter = exporters.start(transport, LAYOUT)
    exporter.register("victim", [0, 1], 12)
    handle = exporter.complete("victim", 5)
    thief = KvImporter(filled(KvPool(LAYOUT, 4), 0xCD), generate_key())   # has the handle, not the key
    params = decode(handle, exporters.key, time.time())   # (what the thief learnt by reading the handle)
    with pytest.raises(KvPeerAuthError, match="did not prove it holds the deployment's KV key"):
        thief.pull(params, [0, 1])
    assert (thief.pool.data.view(torch.uint8) == 0xCD).all()          # nothing arrived
    stats = exporter.stats()
    assert (stats["num_refused"], stats["num_pending"], stats["bytes_sent"]) == (1, 1, 0)
    owner = KvImporter(KvPool(LAYOUT, 4), exporters.key)
    result = owner.pull(owner.verify(handle, time.time()), [2, 3])
    assert result.first_token == 5
    got = owner.pool.data.view(torch.uint8).reshape(LAYOUT.num_layers, 4, 2, LAYOUT.tokens_per_block, -1)
    assert torch.equal(got[:, 2], exporter.expected_bytes()[:, 0])   # the first (full) block, byte for byte
    assert exporter.wait_released("victim")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_old_bearer_pull_carrying_only_the_handle_is_refused(exporters, transport):
    exporter = exporters.start(transport, LAYOUT)
    exporter.register("r", [0], 4)
    handle = exporter.complete("r", 1)
    with connect(exporter.endpoint) as sock:
        hello(sock)
        frame.send_frame(sock, Kind.PULL, handle)       # what a pull was before: the handle alone
        header, message = answer(sock)
    assert header.kind == Kind.ERROR and header.code == ErrorCode.UNAUTHENTICATED
    assert b"refused the pull" in message and b"a handle alone does not give access to KV" in message
    assert exporter.stats()["num_pending"] == 1       # the export waits for its real puller


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_captured_pull_replayed_on_another_connection_is_refused(exporters, transport):
    exporter = exporters.start(transport, LAYOUT)
    exporter.register("seen", [0], 4)
    handle = exporter.complete("seen", 1)
    with connect(exporter.endpoint) as first:          # a genuine puller; an eavesdropper records its PULL
        payload, _ = auth.pack_pull(exporters.key, hello(first), handle)
        frame.send_frame(first, Kind.PULL, payload)
        header, _ = answer(first)
        assert header.kind == Kind.ACCEPT              # the proof was good on its own connection
    with connect(exporter.endpoint) as second:
        hello(second)                                  # a new challenge ...
        frame.send_frame(second, Kind.PULL, payload)   # ... answered with the recorded bytes
        header, message = answer(second)
    assert header.kind == Kind.ERROR and header.code == ErrorCode.UNAUTHENTICATED, message
    stats = exporter.stats()
    assert stats["num_refused"] == 1 and stats["bytes_sent"] == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_key_proof_does_not_replace_the_handle_signature(exporters, transport):
    """A peer with the key but an altered handle is still refused as forged."""
    exporter = exporters.start(transport, LAYOUT)
    exporter.register("r", [0], 4)
    handle = bytearray(exporter.complete("r", 1))
    handle[-3] ^= 0x01
    with connect(exporter.endpoint) as sock:
        payload, _ = auth.pack_pull(exporters.key, hello(sock), bytes(handle))
        frame.send_frame(sock, Kind.PULL, payload)
        header, message = answer(sock)
    assert header.kind == Kind.ERROR and header.code == ErrorCode.FORGED, message


def test_an_endpoint_without_the_key_cannot_pose_as_the_exporter():
    """Something else listening on the handle's port (the prefill server died, another user bound it):
    its ACCEPT carries no valid proof, so the importer reads nothing from it."""
    key = generate_key()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: dict = {}

    def impostor():
        sock, _ = listener.accept()
        with sock:
            frame.send_frame(sock, Kind.HELLO, auth.new_nonce())
            header, seen["pull"] = frame.recv_frame(sock, 1 << 20)
            frame.send_frame(sock, Kind.ACCEPT, bytes(auth.PROOF_BYTES))   # it cannot compute the proof
            try:
                for layer in range(LAYOUT.num_layers):                    # and offers bytes of its own
                    frame.send_frame(sock, Kind.LAYER, b"\xee" * (LAYOUT.bytes_for(4) // LAYOUT.num_layers),
                                     layer=layer)
                sock.settimeout(10.0)
                sock.recv(1)                                               # until the importer hangs up
            except (BrokenPipeError, ConnectionResetError):
                seen["hung_up"] = True                                     # the importer left at the ACCEPT

    thread = threading.Thread(target=impostor, daemon=True)
    thread.start()
    now = time.time()
    params = ContextPhaseParams(1, f"tcp://127.0.0.1:{port}", "r", LAYOUT, 4, 1, now, now + 30)
    importer = KvImporter(filled(KvPool(LAYOUT, 2), 0x11), key)
    with pytest.raises(KvPeerAuthError, match="did not prove it holds the deployment's KV key.*not this "
                                              "deployment's prefill exporter"):
        importer.pull(decode(encode(params, key), key, now), [0])
    thread.join(5)
    listener.close()
    assert (importer.pool.data.view(torch.uint8) == 0x11).all()
    assert len(seen["pull"]) > auth.PROOF_BYTES + auth.NONCE_BYTES    # the importer did answer the challenge


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_puller_with_the_key_gets_exactly_the_exported_bytes(exporters, transport):
    exporter = exporters.start(transport, LAYOUT)
    exporter.register("ok", [3], 8)
    importer = KvImporter(KvPool(LAYOUT, 4), exporters.key)
    result = importer.pull(importer.verify(exporter.complete("ok", 9), time.time()), [1])
    assert result.first_token == 9
    got = importer.pool.data.view(torch.uint8).reshape(LAYOUT.num_layers, 4, -1)[:, 1]
    want = exporter.expected_bytes()[:, 3].reshape(LAYOUT.num_layers, -1)
    assert torch.equal(got, want)
