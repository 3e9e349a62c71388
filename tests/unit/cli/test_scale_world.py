"""`trtpd scale` on backend tensorrt-llm: the new counts are a new world rolled out like `trtpd rollout`, so the
command says so and fails (exit 1) when that world failed its gate and was drained. The controller and its store are
stood in for (the controller's side is tests/unit/controller/test_worlds.py; end to end, tests/e2e/test_controller.py
::test_a_triton_world_is_replaced_by_a_bigger_world_under_streaming_load)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import trtpd.cli.controller_client as client
from trtpd.cli.main import main


@pytest.mark.parametrize("status, code", [("promoted", 0), ("rolled_back", 1)])
def test_scaling_a_world_exits_with_the_new_worlds_fate(monkeypatch, capsys, status, code):
    store = SimpleNamespace(revision=lambda n: SimpleNamespace(number=n, status=status))
    monkeypatch.setattr(client, "open_store", lambda name: store)
    monkeypatch.setattr(client, "last_audit_id", lambda s: 0)
    monkeypatch.setattr(client, "wait_converged", lambda *a, **k: None)
    monkeypatch.setattr(client, "submit_and_wait", lambda name, kind, payload: {
        "from": {"prefill": 1, "decode": 1}, "to": {"prefill": 2, "decode": 1}, "world": True, "revision": 2})
    assert main(["scale", "w", "prefill=2"]) == code
    out = capsys.readouterr().out
    assert "w: {'prefill': 1, 'decode': 1} -> {'prefill': 2, 'decode': 1} as a new world (revision 2" in out
    assert f"revision 2: {'promoted' if code == 0 else 'rolled back'}" in out
