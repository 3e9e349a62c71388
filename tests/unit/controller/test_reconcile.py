"""The reconcile core over a fake clock: every lifecycle transition and every action it takes."""

from __future__ import annotations

from trtpd.controller.reconcile import ReconcilePolicy, next_indices, reconcile as _reconcile
from trtpd.controller.types import InstanceRow, ObservedInstance

POLICY = ReconcilePolicy(start_timeout_s=60, drain_timeout_s=30, quiet_s=1.0, unhealthy_grace_s=5)


def reconcile(want, table, observed, now_s, next_index):
    return _reconcile(want, table, observed, now_s, next_index, POLICY)


def row(name, state, since=0.0, revision=1, **detail):
    return InstanceRow(name, name.rsplit("-", 1)[0], revision, state, since, "", detail)


def seen(name, alive=True, ready=True, holds=0, revision=1, reason=""):
    return ObservedInstance(name, name.rsplit("-", 1)[0], revision, alive, ready, holds, reason)


def kinds(result):
    return [(a.kind, a.instance, a.force) for a in result.actions]


def states(result):
    return {r.name: r.state for r in result.rows}


def test_starts_what_is_missing_with_fresh_names():
    result = reconcile({("decode", 1): 2, ("prefill", 1): 1}, [], [], 10.0, {"decode": 3})
    assert kinds(result) == [("start", "decode-3", False), ("start", "decode-4", False), ("start", "prefill-0", False)]
    assert states(result) == {"decode-3": "starting", "decode-4": "starting", "prefill-0": "starting"}
    assert all(r.since_s == 10.0 and r.revision == 1 for r in result.rows)
    assert next_indices(result.rows, {"decode": 3}) == {"decode": 5, "prefill": 1}


def test_nothing_to_do_when_converged():
    result = reconcile({("decode", 1): 1}, [row("decode-0", "ready")], [seen("decode-0")], 10.0, {"decode": 1})
    assert result.actions == [] and result.rows == []


def test_starting_becomes_ready_and_reports_start_time():
    result = reconcile({("decode", 1): 1}, [row("decode-0", "starting", since=4.0)], [seen("decode-0")], 6.5, {})
    assert states(result) == {"decode-0": "ready"}
    assert result.events[0]["action"] == "ready" and result.events[0]["start_s"] == 2.5
    assert result.actions == []


def test_starting_too_long_fails_and_is_replaced():
    table = [row("decode-0", "starting", since=0.0)]
    obs = [seen("decode-0", ready=False)]
    assert reconcile({("decode", 1): 1}, table, obs, 59.0, {"decode": 1}).actions == []
    result = reconcile({("decode", 1): 1}, table, obs, 61.0, {"decode": 1})
    assert kinds(result) == [("stop", "decode-0", True), ("start", "decode-1", False)]
    assert states(result) == {"decode-0": "stopped", "decode-1": "starting"}
    assert "start_timeout_s" in next(r for r in result.rows if r.name == "decode-0").reason


def test_dead_instance_is_replaced_in_the_same_pass():
    table = [row("prefill-0", "ready"), row("decode-0", "ready")]
    obs = [seen("decode-0"), seen("prefill-0", alive=False, ready=False, reason="tritonserver (pid 9) is not running")]
    result = reconcile({("prefill", 1): 1, ("decode", 1): 1}, table, obs, 100.0, next_indices(table, {}))
    assert kinds(result) == [("stop", "prefill-0", True), ("start", "prefill-1", False)]
    dead = next(r for r in result.rows if r.name == "prefill-0")
    assert dead.state == "stopped" and "pid 9" in dead.reason
    assert [e["action"] for e in result.events] == ["failed"]


def test_missing_from_observation_counts_as_dead():
    result = reconcile({("decode", 1): 1}, [row("decode-0", "ready")], [], 5.0, {"decode": 1})
    assert kinds(result) == [("stop", "decode-0", True), ("start", "decode-1", False)]


def test_unhealthy_needs_the_grace_period_then_is_replaced():
    want, obs = {("decode", 1): 1}, [seen("decode-0", ready=False)]
    first = reconcile(want, [row("decode-0", "ready")], obs, 10.0, {"decode": 1})
    assert first.actions == [] and first.rows[0].detail["unready_since_s"] == 10.0
    second = reconcile(want, first.rows, obs, 14.0, {"decode": 1})
    assert second.actions == []
    recovered = reconcile(want, first.rows, [seen("decode-0")], 14.0, {"decode": 1})
    assert recovered.rows[0].detail["unready_since_s"] is None and recovered.actions == []
    third = reconcile(want, first.rows, obs, 15.5, {"decode": 1})
    assert kinds(third) == [("stop", "decode-0", True), ("start", "decode-1", False)]
    assert "health checks failing" in next(r for r in third.rows if r.name == "decode-0").reason


def test_scale_down_drains_the_least_loaded_newest_ready_one():
    table = [row("decode-0", "ready"), row("decode-1", "ready"), row("decode-2", "ready")]
    obs = [seen("decode-0", holds=0), seen("decode-1", holds=3), seen("decode-2", holds=0)]
    result = reconcile({("decode", 1): 1}, table, obs, 10.0, {"decode": 3})
    assert kinds(result) == [("drain", "decode-2", False), ("drain", "decode-0", False)]
    assert states(result) == {"decode-2": "draining", "decode-0": "draining"}


def test_scale_down_stops_a_starting_instance_first():
    table = [row("decode-0", "ready"), row("decode-1", "starting")]
    obs = [seen("decode-0"), seen("decode-1", ready=False)]
    result = reconcile({("decode", 1): 1}, table, obs, 10.0, {"decode": 2})
    assert kinds(result) == [("stop", "decode-1", True)]


def test_draining_retires_only_after_holding_nothing_for_quiet_s():
    want = {("decode", 1): 1}
    table = [row("decode-0", "ready"), row("decode-1", "draining", since=10.0, holds_zero_since_s=None)]
    busy = reconcile(want, table, [seen("decode-0"), seen("decode-1", holds=2)], 11.0, {"decode": 2})
    assert busy.actions == [] and busy.rows == []
    idle = [seen("decode-0"), seen("decode-1", holds=0)]
    first = reconcile(want, table, idle, 12.0, {"decode": 2})
    assert first.actions == [] and first.rows[0].detail["holds_zero_since_s"] == 12.0
    table2 = [table[0], first.rows[0]]
    # a hold that reappears (a request the metrics had not shown yet) restarts the quiet period
    again = reconcile(want, table2, [seen("decode-0"), seen("decode-1", holds=1)], 12.5, {"decode": 2})
    assert again.rows[0].detail["holds_zero_since_s"] is None and again.actions == []
    done = reconcile(want, table2, idle, 13.0, {"decode": 2})
    assert kinds(done) == [("stop", "decode-1", False)]
    assert done.events[0] == {"action": "drained", "instance": "decode-1", "role": "decode", "revision": 1,
                              "drain_s": 3.0}


def test_unknown_holds_keep_an_instance_draining():
    table = [row("decode-0", "ready"), row("decode-1", "draining", since=10.0)]
    result = reconcile({("decode", 1): 1}, table, [seen("decode-0"), seen("decode-1", holds=-1)], 20.0, {})
    assert result.actions == []


def test_drain_timeout_stops_with_force_and_names_what_was_held():
    table = [row("decode-0", "ready"), row("decode-1", "draining", since=10.0)]
    result = reconcile({("decode", 1): 1}, table, [seen("decode-0"), seen("decode-1", holds=2)], 40.5, {})
    assert kinds(result) == [("stop", "decode-1", True)]
    assert "2 request(s)" in result.actions[0].reason and "drain timeout" in result.actions[0].reason
    assert result.events[0]["action"] == "drain_timeout"


def test_instance_gone_while_draining_is_just_recorded_stopped():
    table = [row("decode-0", "ready"), row("decode-1", "draining", since=10.0)]
    result = reconcile({("decode", 1): 1}, table, [seen("decode-0")], 11.0, {})
    assert kinds(result) == [("stop", "decode-1", True)] and states(result) == {"decode-1": "stopped"}


def test_unwanted_revision_is_drained_and_wanted_one_started():
    table = [row("decode-0", "ready", revision=1)]
    result = reconcile({("decode", 2): 1}, table, [seen("decode-0")], 5.0, {"decode": 1})
    assert kinds(result) == [("drain", "decode-0", False), ("start", "decode-1", False)]
    assert next(r for r in result.rows if r.name == "decode-1").revision == 2


def test_a_failed_row_left_from_an_interrupted_pass_is_stopped_again():
    result = reconcile({("decode", 1): 1}, [row("decode-0", "failed")], [], 5.0, {"decode": 1})
    assert kinds(result) == [("stop", "decode-0", True), ("start", "decode-1", False)]


def test_stopped_rows_are_history_only():
    result = reconcile({("decode", 1): 1}, [row("decode-0", "stopped"), row("decode-1", "ready")],
                       [seen("decode-1")], 5.0, {"decode": 2})
    assert result.actions == []
