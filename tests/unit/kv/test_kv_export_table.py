import threading

import pytest

from trtpd.kv.export_table import Abort, ExportTable, PeerGone
from trtpd.kv.frame import ErrorCode


def test_fail_without_a_pull_releases_at_once_and_calls_back():
    calls = []
    table = ExportTable(num_layers=4, on_release=lambda: calls.append(1))
    table.add("a", [0, 1], 40, timeout_s=30.0)
    table.fail("a", "cancelled")
    assert table.drain_released() == ["a"] and calls == [1]
    assert table.drain_released() == []
    with pytest.raises(Abort, match=r"already released \(prefill failed: cancelled\)") as info:
        table.attach("a", 0.0)
    assert info.value.code == ErrorCode.NOT_FOUND


def test_fail_with_a_pull_attached_aborts_it_and_leaves_the_release_to_the_session():
    table = ExportTable(num_layers=4)
    export = table.add("a", [0], 10, timeout_s=30.0)
    table.attach("a", 0.0)
    table.mark_ready(["a"], 0)
    assert table.wait_layers(export, 0) == 1
    table.fail("a", "oom")
    assert table.drain_released() == []         # the session may still read the blocks
    with pytest.raises(Abort, match="prefill failed: oom"):
        table.wait_layers(export, 1)
    table.release(export, "prefill failed: oom")
    assert table.drain_released() == ["a"]


def test_discard_releases_at_once_counted_apart_from_failures_and_a_late_pull_learns_why():
    """The request ended at its first token (prefill_engine.py): its export is released, not failed."""
    calls = []
    table = ExportTable(num_layers=4, on_release=lambda: calls.append(1))
    table.add("a", [0, 1], 40, timeout_s=30.0)
    table.discard("a", "the request ended at its first token")
    assert table.drain_released() == ["a"] and calls == [1]
    assert (table.counters.num_discarded, table.counters.num_failed) == (1, 0)
    with pytest.raises(Abort, match=r"already released \(nothing to pull: the request ended at its first token\)"):
        table.attach("a", 0.0)
    table.discard("a", "again")                   # gone: nothing happens
    assert table.counters.num_discarded == 1 and table.drain_released() == []


def test_second_pull_is_busy_and_unknown_request_is_not_found():
    table = ExportTable(num_layers=2)
    table.add("a", [0], 10, timeout_s=30.0)
    table.attach("a", 0.0)
    with pytest.raises(Abort) as busy:
        table.attach("a", 0.0)
    with pytest.raises(Abort, match="never exported here") as unknown:
        table.attach("b", 0.0)
    assert (busy.value.code, unknown.value.code) == (ErrorCode.BUSY, ErrorCode.NOT_FOUND)


def test_complete_marks_every_layer_ready_and_a_gone_export_cannot_complete():
    table = ExportTable(num_layers=3)
    export = table.add("a", [0], 10, timeout_s=30.0)
    table.complete("a", 42)
    assert table.wait_layers(export, 2) == 3 and table.wait_first_token(export) == 42
    with pytest.raises(KeyError):
        table.complete("missing", 1)
    table.mark_ready(["missing"], 1)             # a released export may still be in the prefill batch
    with pytest.raises(ValueError, match="outside"):
        table.mark_ready(["a"], 3)


def test_reaper_times_out_an_unpulled_export_and_an_acked_one_never():
    released = threading.Event()
    table = ExportTable(num_layers=1, on_release=released.set)
    reaper = threading.Thread(target=table.reap_until_closed, daemon=True)
    reaper.start()
    acked = table.add("acked", [0], 1, timeout_s=0.05)
    table.attach("acked", 0.0)
    table.ack(acked, 2)
    table.add("late", [1], 1, timeout_s=0.05)
    assert released.wait(timeout=5.0)
    assert table.drain_released() == ["late"]
    assert table.counters.num_timeouts == 1 and "acked" in table.exports
    table.close("test over")
    reaper.join(timeout=5.0)
    assert not reaper.is_alive()


def test_duplicate_request_id_is_refused():
    table = ExportTable(num_layers=1)
    table.add("a", [0], 1, timeout_s=1.0)
    with pytest.raises(ValueError, match="unique"):
        table.add("a", [1], 1, timeout_s=1.0)


def test_a_handle_of_an_earlier_export_with_the_same_id_is_refused():
    table = ExportTable(num_layers=1)
    table.add("a", [0], 1, timeout_s=1.0, registered_at_s=100.0)
    with pytest.raises(Abort, match="earlier export of this request id"):
        table.attach("a", issued_at_s=99.0)
    assert table.attach("a", issued_at_s=100.0).request_id == "a"


def test_a_session_waiting_on_prefill_sees_its_puller_hang_up_and_the_release_counts_a_broken_pull():
    table = ExportTable(num_layers=2)
    export = table.add("a", [0], 10, timeout_s=30.0)
    table.attach("a", 0.0)
    checks = []

    def peer_gone():
        checks.append(1)
        return "the decode side closed the connection" if len(checks) >= 3 else None

    with pytest.raises(PeerGone, match="closed the connection"):
        table.wait_layers(export, 0, peer_gone=peer_gone)     # no layer ever becomes ready: only the check ends it
    assert len(checks) == 3
    table.release(export, "pull connection broke")
    assert table.drain_released() == ["a"] and table.counters.num_broken_pulls == 1
    assert table.counters.num_timeouts == 0


def test_the_first_token_wait_watches_the_puller_too_and_a_present_puller_gets_the_token():
    table = ExportTable(num_layers=1)
    export = table.add("a", [0], 10, timeout_s=30.0)
    table.attach("a", 0.0)
    table.mark_ready(["a"], 0)
    with pytest.raises(PeerGone):
        table.wait_first_token(export, peer_gone=lambda: "reset")
    other = table.add("b", [1], 10, timeout_s=30.0)
    table.attach("b", 0.0)
    threading.Timer(0.3, table.complete, args=("b", 7)).start()
    assert table.wait_first_token(other, peer_gone=lambda: None) == 7
