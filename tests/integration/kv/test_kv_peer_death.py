"""A peer killed in the middle of a pull, on every transport: the survivor fails or releases cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.kv.conftest import Exporters, PrefillProcess
from trtpd.kv.errors import KvConnectError, KvTransferTimeoutError
from trtpd.kv.importer import KvImporter
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import SHM_DIR, KvPool

from tests.integration.kv.conftest import transports_under_test

pytestmark = pytest.mark.integration
TRANSPORTS = transports_under_test()
LAYOUT = KvLayout(num_layers=4, num_kv_heads=2, head_size=16, tokens_per_block=8, dtype="fp16")
IMPORTER = Path(__file__).with_name("importer_child.py")


def start_importer(key: bytes, handle: bytes, dst_block_ids: list[int]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(IMPORTER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).parents[3])
    proc.stdin.write(json.dumps({"key_hex": key.hex(), "handle_hex": handle.hex(), "dst_block_ids": dst_block_ids,
                                 "num_blocks": 8}) + "\n")
    proc.stdin.flush()
    return proc


def kill_after_layer_0(key: bytes, exporter, request_id: str, handle: bytes) -> None:
    """A decode-side process pulls `request_id` into blocks [2, 3] and is SIGKILLed once layer 0 has landed."""
    importer = start_importer(key, handle, [2, 3])
    try:
        exporter.mark([request_id], 0)
        assert importer.stdout.readline().strip() == "layer 0"     # the channel is open, layer 0 moved
        os.kill(importer.pid, signal.SIGKILL)
        importer.wait(10)
    finally:
        if importer.poll() is None:
            importer.kill()
            importer.wait()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_decode_killed_mid_pull_releases_the_blocks_and_the_exporter_serves_others(exporters, transport):
    exporter = exporters.start(transport, LAYOUT, timeout_s=20.0)
    handle = exporter.register("req-k", [0, 1], 12)
    kill_after_layer_0(exporters.key, exporter, "req-k", handle)
    start_s = time.monotonic()
    for layer in range(1, LAYOUT.num_layers):     # prefill goes on; the session finds its peer gone
        exporter.mark(["req-k"], layer)             # (and releases at once: complete() would find it gone)
    assert exporter.wait_released("req-k", timeout_s=20.0)
    assert time.monotonic() - start_s < 20.0
    stats = exporter.stats()
    assert (stats["num_pending"], stats["num_pulls"], stats["num_broken_pulls"], stats["num_timeouts"]) == (0, 0, 1, 0)
    other = KvImporter(KvPool(LAYOUT, 8), exporters.key)       # the exporter still serves
    exporter.register("req-next", [4], 8)
    assert other.pull(other.verify(exporter.complete("req-next", 9), time.time()), [5]).first_token == 9
    assert exporter.wait_released("req-next")
    other.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_decode_killed_while_prefill_is_still_running_releases_the_blocks_before_prefill_goes_on(exporters, transport):
    """No further layer, no first token: only the session's watch on its socket can see the puller is gone
    (before it, the blocks stayed held until the export's deadline and the release counted a timeout)."""
    exporter = exporters.start(transport, LAYOUT, timeout_s=60.0)
    handle = exporter.register("req-s", [0, 1], 12)
    kill_after_layer_0(exporters.key, exporter, "req-s", handle)
    assert exporter.wait_released("req-s", timeout_s=30.0)    # half the deadline: a timeout cannot pass this
    stats = exporter.stats()
    assert (stats["num_pending"], stats["num_pulls"], stats["num_broken_pulls"], stats["num_timeouts"]) == (0, 0, 1, 0)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_prefill_killed_mid_pull_fails_the_pull_with_a_clear_error_in_time(transport):
    process = PrefillProcess()
    exporters = Exporters(process, f"trtpd_test_{os.getpid()}_death_{transport}")
    try:
        exporter = exporters.start(transport, LAYOUT)
        importer = KvImporter(KvPool(LAYOUT, 8), exporters.key)
        params = importer.verify(exporter.register("req-p", [0, 1], 12), time.time())
        got_layer, outcome = threading.Event(), {}

        def pull():
            try:
                outcome["result"] = importer.pull(params, [0, 1], on_layer=lambda layer: got_layer.set())
            except Exception as e:  # noqa: BLE001 - the test inspects it
                outcome["error"] = e
        start_s = time.monotonic()
        thread = threading.Thread(target=pull, daemon=True)
        thread.start()
        exporter.mark(["req-p"], 0)
        assert got_layer.wait(10), outcome
        os.kill(process.proc.pid, signal.SIGKILL)
        thread.join(timeout=15)
        assert not thread.is_alive()
        error = outcome["error"]
        assert isinstance(error, (KvConnectError, KvTransferTimeoutError)), error
        assert "'req-p'" in str(error) and "re-run prefill" in str(error)
        assert time.monotonic() - start_s < 15
        importer.close()
    finally:
        process.proc.kill()
        process.proc.wait()
        for path in SHM_DIR.glob(f"{exporters.prefix}*"):
            path.unlink(missing_ok=True)
