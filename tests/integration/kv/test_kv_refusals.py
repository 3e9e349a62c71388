"""Failed, timed-out, forged and incompatible KV pulls against a real prefill process: clear errors, KV released."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

import numpy as np
import pytest
import torch

from trtpd.kv.auth import KvPeerAuthError
from trtpd.kv.errors import (KvConnectError, KvExportNotFoundError, KvHandleExpiredError, KvHandleForgedError,
                             KvLayoutMismatchError, KvPrefillFailedError, KvTransferTimeoutError)
from trtpd.kv.handle import decode, generate_key
from trtpd.kv.importer import KvImporter
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool

from tests.integration.kv.conftest import transports_under_test

pytestmark = pytest.mark.integration
TRANSPORTS = transports_under_test()
LAYOUT = KvLayout(num_layers=4, num_kv_heads=2, head_size=16, tokens_per_block=8, dtype="fp16")


def pull_in_thread(importer, params, dst_ids, on_layer=None) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = importer.pull(params, dst_ids, on_layer=on_layer)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            outcome["error"] = e
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def first_layer_event() -> tuple[threading.Event, callable]:
    event = threading.Event()
    return event, lambda layer: event.set()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_fail_during_a_pull_reaches_the_puller_and_releases_the_blocks(exporters, transport):
    exporter = exporters.start(transport, LAYOUT)
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    params = importer.verify(exporter.register("req-f", [0, 1], 12), time.time())
    got_layer, on_layer = first_layer_event()
    thread, outcome = pull_in_thread(importer, params, [0, 1], on_layer)
    exporter.mark(["req-f"], 0)
    assert got_layer.wait(10)
    exporter.fail("req-f", "cancelled by the client")
    thread.join(timeout=10)
    error = outcome["error"]
    assert isinstance(error, KvPrefillFailedError)
    assert "'req-f'" in str(error) and exporter.endpoint in str(error) and "cancelled by the client" in str(error)
    assert exporter.wait_released("req-f")
    assert exporter.stats()["num_pending"] == 0


def test_fail_before_any_pull_releases_at_once_and_a_late_pull_learns_why(exporters):
    exporter = exporters.start("tcp", LAYOUT)
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    params = importer.verify(exporter.register("req-g", [2], 3), time.time())
    exporter.fail("req-g", "out of memory")
    assert exporter.wait_released("req-g")
    with pytest.raises(KvExportNotFoundError, match=r"'req-g'.*prefill failed: out of memory.*re-run prefill"):
        importer.pull(params, [0])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unpulled_export_times_out_and_its_handle_goes_stale(exporters, transport):
    exporter = exporters.start(transport, LAYOUT, timeout_s=0.3)
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    exporter.register("req-t", [0, 1], 16)
    handle = exporter.complete("req-t", 1)
    assert exporter.wait_released("req-t", timeout_s=10)
    stats = exporter.stats()
    assert (stats["num_timeouts"], stats["num_pending"]) == (1, 0)
    with pytest.raises(KvHandleExpiredError, match="'req-t' expired"):
        importer.verify(handle, time.time())
    params = decode(handle, exporters.key, now_s=0.0)    # skip the local check: the exporter refuses too
    with pytest.raises(KvHandleExpiredError, match="prefill side refused"):
        importer.pull(params, [0, 1])


def test_a_pull_stalled_by_prefill_times_out_on_the_prefill_side(exporters):
    exporter = exporters.start("tcp", LAYOUT, timeout_s=0.5)
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    params = importer.verify(exporter.register("req-s", [0], 8), time.time())
    got_layer, on_layer = first_layer_event()
    thread, outcome = pull_in_thread(importer, params, [0], on_layer)
    exporter.mark(["req-s"], 0)                          # and no more layers: prefill is stuck
    assert got_layer.wait(10)
    thread.join(timeout=10)
    error = outcome["error"]
    assert isinstance(error, KvTransferTimeoutError)
    assert "'req-s'" in str(error) and "timed out after 0.5 s" in str(error)
    assert exporter.wait_released("req-s")
    assert exporter.stats()["num_timeouts"] == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_forged_handle_is_refused_by_both_sides_and_the_real_export_survives(exporters, transport):
    exporter = exporters.start(transport, LAYOUT)
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    exporter.register("req-x", [0, 1], 16)
    handle = exporter.complete("req-x", 3)
    forged = bytearray(handle)
    forged[-5] ^= 0x20
    with pytest.raises(KvHandleForgedError):
        importer.verify(bytes(forged), time.time())
    params = importer.verify(handle, time.time())
    impostor = KvImporter(KvPool(LAYOUT, 8), generate_key())     # holds the handle, but not the key
    with pytest.raises(KvPeerAuthError, match=r"refused the pull: the puller did not prove it holds the "
                                              r"deployment's KV key"):
        impostor.pull(params, [0, 1])
    stats = exporter.stats()
    assert (stats["num_refused"], stats["num_pending"], stats["bytes_sent"]) == (1, 1, 0)
    assert importer.pull(params, [0, 1]).first_token == 3
    assert exporter.wait_released("req-x")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mismatched_layout_is_refused_before_any_byte_moves(exporters, transport):
    prefill_layout = dataclasses.replace(LAYOUT, dtype="fp8", tokens_per_block=16)
    exporter = exporters.start(transport, prefill_layout)
    dst = KvPool(LAYOUT, 8)
    np.copyto(dst.data.view(torch.uint8).numpy(), 0xAB)
    importer = KvImporter(dst, exporters.key)
    exporter.register("req-m", [0, 1], 20)
    handle = exporter.complete("req-m", 3)
    with pytest.raises(KvLayoutMismatchError) as verified:
        importer.verify(handle, time.time())
    message = str(verified.value)
    assert "'req-m'" in message and exporter.endpoint in message and "nothing was pulled" in message
    assert "KV dtype differs: prefill has fp8, decode has fp16" in message
    assert "KV tokens_per_block differs: prefill has 16, decode has 8" in message
    with pytest.raises(KvLayoutMismatchError):
        importer.pull(decode(handle, exporters.key, time.time()), [0, 1, 2])
    assert dst.data.view(torch.uint8).eq(0xAB).all()
    stats = exporter.stats()
    assert (stats["num_refused"], stats["num_broken_pulls"], stats["bytes_sent"], stats["num_pending"]) == \
        (0, 0, 0, 1)


def test_unreachable_exporter_names_the_request_and_endpoint(exporters):
    exporter = exporters.start("tcp", LAYOUT)
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    params = importer.verify(exporter.register("req-c", [0], 4), time.time())
    with socket.socket() as probe:                       # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    moved = dataclasses.replace(params, endpoint=f"tcp://127.0.0.1:{closed_port}")
    with pytest.raises(KvConnectError, match=rf"'req-c' from tcp://127.0.0.1:{closed_port}: cannot connect "
                                             r"\(Connection refused\).*prefill instance is up"):
        importer.pull(moved, [0])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exporter_shutdown_during_a_pull_tells_the_puller(exporters, transport):
    exporter = exporters.start(transport, LAYOUT)
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    params = importer.verify(exporter.register("req-d", [0], 8), time.time())
    got_layer, on_layer = first_layer_event()
    thread, outcome = pull_in_thread(importer, params, [0], on_layer)
    exporter.mark(["req-d"], 0)
    assert got_layer.wait(10)
    exporter.close()
    thread.join(timeout=10)
    error = outcome["error"]
    assert isinstance(error, KvConnectError)
    assert "'req-d'" in str(error) and "shutting down" in str(error) and "another prefill instance" in str(error)


def test_handle_of_an_earlier_export_cannot_pull_a_reused_request_id(exporters):
    exporter = exporters.start("tcp", LAYOUT)
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    old = importer.verify(exporter.register("req-r", [0], 8), time.time())
    exporter.fail("req-r", "cancelled")
    assert exporter.wait_released("req-r")
    exporter.register("req-r", [1], 8)                   # the engine reused the id
    exporter.complete("req-r", 4)
    with pytest.raises(KvExportNotFoundError, match="earlier export of this request id"):
        importer.pull(old, [0])
    assert exporter.stats()["num_pending"] == 1
