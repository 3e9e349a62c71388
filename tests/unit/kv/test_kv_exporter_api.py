"""The exporter's engine-facing API in one process (no pull): validation, handles, wakeup, release."""

import threading
import time

import pytest

from trtpd.errors import ConfigError
from trtpd.kv.errors import KvExportNotFoundError
from trtpd.kv.exporter import KvExporter
from trtpd.kv.handle import decode, generate_key
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool

LAYOUT = KvLayout(num_layers=2, num_kv_heads=1, head_size=4, tokens_per_block=4, dtype="fp16")
KEY = generate_key()


@pytest.fixture
def exporter():
    woken = threading.Event()
    exporter = KvExporter(KvPool(LAYOUT, 4), KEY, transport="tcp", transfer_timeout_s=30.0, wakeup=woken.set)
    exporter.woken = woken
    yield exporter
    exporter.close()


def test_register_and_complete_issue_signed_handles(exporter):
    early = decode(exporter.register("r", [2, 0], 6), KEY, time.time())
    assert (early.request_id, early.num_tokens, early.first_token, early.endpoint) == ("r", 6, None, exporter.endpoint)
    assert exporter.endpoint.startswith("tcp://127.0.0.1:")
    assert 29.0 < early.expires_at_s - early.issued_at_s <= 30.0
    final = decode(exporter.complete("r", 11), KEY, time.time())
    assert final.first_token == 11 and final.layout == LAYOUT
    assert exporter.num_pending == 1


def test_fail_releases_and_wakes_the_engine(exporter):
    exporter.register("r", [1], 3)
    exporter.fail("r", "cancelled")
    assert exporter.woken.wait(5.0)
    assert exporter.drain_released() == ["r"] and exporter.num_pending == 0
    with pytest.raises(KvExportNotFoundError, match=r"'r'.*already released \(prefill failed: cancelled\)"):
        exporter.complete("r", 1)
    exporter.mark_layers_ready(["r"], 1)          # a released request still in the batch: ignored


def test_register_checks_block_ids(exporter):
    with pytest.raises(ValueError, match="need 2 blocks"):
        exporter.register("r", [0], 5)
    with pytest.raises(ValueError, match=r"in \[0, 4\)"):
        exporter.register("r", [4], 1)


def test_bad_configuration_is_refused():
    with pytest.raises(ConfigError, match="needs the prefill pool in shared memory"):
        KvExporter(KvPool(LAYOUT, 1), KEY, transport="shm")
    with pytest.raises(ConfigError, match="is not one of tcp, shm"):
        KvExporter(KvPool(LAYOUT, 1), KEY, transport="rdma")
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        KvExporter(KvPool(LAYOUT, 1), b"k", transport="tcp")


def test_peer_gone_tells_a_closed_or_reset_peer_from_a_quiet_one_and_leaves_sent_bytes_unread():
    import socket

    from trtpd.kv.frame import peer_gone
    quiet, peer = socket.socketpair()
    with quiet, peer:
        assert peer_gone(quiet) is None
        peer.sendall(b"x")
        assert peer_gone(quiet) is None and quiet.recv(1) == b"x"     # peeked, not consumed
        peer.close()
        assert peer_gone(quiet) == "the peer closed the connection"
