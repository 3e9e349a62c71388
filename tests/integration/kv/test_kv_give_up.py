"""A handle that will never be pulled (its request was cancelled or failed before the pull) is given up: the prefill
process frees its blocks at once instead of at the export's deadline; a pull under way is left to finish; only a
holder of the deployment key can give an export up."""

from __future__ import annotations

import threading
import time

import pytest

from trtpd.kv.auth import KvPeerAuthError
from trtpd.kv.errors import KvExportNotFoundError, KvHandleForgedError
from trtpd.kv.handle import generate_key
from trtpd.kv.importer import KvImporter, give_up_handle
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool

from tests.integration.kv.conftest import transports_under_test

pytestmark = pytest.mark.integration
TRANSPORTS = transports_under_test()
LAYOUT = KvLayout(num_layers=4, num_kv_heads=2, head_size=16, tokens_per_block=8, dtype="fp16")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_given_up_export_is_released_at_once_and_a_late_pull_learns_why(exporters, transport):
    exporter = exporters.start(transport, LAYOUT, timeout_s=60.0)   # its deadline is far: only the release frees it
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    exporter.register("req-a", [0, 1], 12)
    params = importer.verify(exporter.complete("req-a", 7), time.time())
    assert exporter.stats()["num_pending"] == 1
    started = time.monotonic()
    assert importer.give_up(params) == "released"
    assert exporter.wait_released("req-a", timeout_s=5.0) and time.monotonic() - started < 5.0
    stats = exporter.stats()
    assert stats["num_pending"] == 0 and stats["num_given_up"] == 1 and stats["num_timeouts"] == 0
    with pytest.raises(KvExportNotFoundError, match=r"'req-a'.*given up by the decode side"):
        importer.pull(params, [0, 1])
    assert importer.give_up(params) == "gone"          # a second time: nothing left to give up
    assert exporter.stats()["num_given_up"] == 1


def test_the_gateway_gives_a_handle_up_with_the_key_alone_and_others_cannot(exporters):
    exporter = exporters.start("tcp", LAYOUT, timeout_s=60.0)
    exporter.register("req-b", [2], 5)
    handle = exporter.complete("req-b", 3)
    with pytest.raises(KvHandleForgedError):            # another key: the handle does not even verify
        give_up_handle(handle, generate_key())
    assert exporter.stats()["num_pending"] == 1
    assert give_up_handle(handle, exporters.key) == "released"
    assert exporter.wait_released("req-b", timeout_s=5.0)


def test_a_release_without_the_key_proof_is_refused(exporters, monkeypatch):
    """The exporter checks the RELEASE's own proof: a peer that relabels a PULL proof (or has none) gets nothing."""
    from trtpd.kv import auth
    exporter = exporters.start("tcp", LAYOUT, timeout_s=60.0)
    exporter.register("req-c", [3], 5)
    handle = exporter.complete("req-c", 3)
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    params = importer.verify(handle, time.time())
    monkeypatch.setattr(auth, "pack_release", lambda key, nonce, blob: auth.pack_pull(key, nonce, blob)[0])
    with pytest.raises(KvPeerAuthError, match="refused the release"):
        importer.give_up(params)
    stats = exporter.stats()
    assert stats["num_pending"] == 1 and stats["num_given_up"] == 0 and stats["num_refused"] == 1


def test_a_pull_under_way_is_not_cut_off_by_a_give_up(exporters):
    exporter = exporters.start("tcp", LAYOUT, timeout_s=60.0)
    importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
    params = importer.verify(exporter.register("req-d", [0, 1], 12), time.time())
    got_layer, outcome = threading.Event(), {}

    def pull() -> None:
        try:
            outcome["result"] = importer.pull(params, [4, 5], on_layer=lambda layer: got_layer.set())
        except Exception as e:  # noqa: BLE001 - the test inspects it
            outcome["error"] = e
    thread = threading.Thread(target=pull, daemon=True)
    thread.start()
    exporter.mark(["req-d"], 0)
    assert got_layer.wait(10)                            # attached and streaming
    assert importer.give_up(params) == "pulling"
    for layer in range(1, LAYOUT.num_layers):
        exporter.mark(["req-d"], layer)
    exporter.complete("req-d", 11)
    thread.join(timeout=10)
    assert "error" not in outcome and outcome["result"].first_token == 11
    stats = exporter.stats()
    assert stats["num_pulls"] == 1 and stats["num_given_up"] == 0 and stats["num_pending"] == 0
