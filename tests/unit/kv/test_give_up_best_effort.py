"""The orchestrator's best-effort give-up (kv/importer.py): what it tells, and that a failure never escapes."""

from __future__ import annotations

import trtpd.kv.importer as importer


def test_by_handle_first_then_by_request_id_and_nothing_without_either(monkeypatch):
    told = []
    monkeypatch.setattr(importer, "give_up_handle", lambda handle, key: told.append(("handle", handle)))
    monkeypatch.setattr(importer, "give_up_request", lambda ep, rid, key: told.append(("request", ep, rid)))
    assert importer.give_up_best_effort(b"k", b"h", "127.0.0.1:1", "r-p1") is True
    assert importer.give_up_best_effort(b"k", None, "127.0.0.1:1", "r-p1") is True
    assert importer.give_up_best_effort(b"k", None) is False
    assert told == [("handle", b"h"), ("request", "127.0.0.1:1", "r-p1")]


def test_a_failure_is_logged_not_raised(monkeypatch, caplog):
    def gone(handle, key):
        raise importer.KvConnectError("the exporter is gone")
    monkeypatch.setattr(importer, "give_up_handle", gone)
    with caplog.at_level("INFO", logger="trtpd.kv.importer"):
        assert importer.give_up_best_effort(b"k", b"h") is False
    assert "freed at the export's deadline" in caplog.text
