"""The engines' step trace (trtpd/engine/step_trace.py): what a forward pass's rows say about its shape, and which
turns of the engine loop are decode steps whose period the serving probe may read."""

import os
import stat

from trtpd.engine import step_trace
from trtpd.engine.step_trace import decode_periods, shape_of


def test_a_pass_is_read_as_prefill_decode_or_both_from_its_rows():
    assert shape_of([[300, 0], [20, 0]]) == ("prefill", 320, 300 ** 2 + 20 ** 2, 0, 0)
    # a decode row feeds one token at position start_pos: its context is start_pos + 1
    assert shape_of([[1, 99], [1, 9]]) == ("decode", 0, 0, 2, 100 + 10)
    assert shape_of([[128, 0], [1, 49]]) == ("mixed", 128, 128 ** 2, 1, 50)
    # a one-token prompt (start_pos 0) is a prefill, not a decode row
    assert shape_of([[1, 0]]) == ("prefill", 1, 1, 0, 0)


def _turn(t_s, dt_s, rows, emit_s=0.0005):
    """A loop turn of `dt_s` starting at t_s whose one pass (if rows) starts 0.1 ms in."""
    records = [{"kind": "step", "t_s": t_s, "dt_s": dt_s, "emit_s": emit_s, "outputs": len(rows or [])}]
    if rows is not None:
        records.append({"kind": "forward", "t_s": t_s + 0.0001, "dt_s": dt_s - 0.0002, "rows": rows})
    return records


def test_a_decode_steps_period_runs_from_its_turns_start_to_the_next_turns():
    records = (_turn(0.000, 0.004, [[1, 10]]) + _turn(0.005, 0.004, [[1, 11], [1, 20]])
               + _turn(0.0102, 0.004, [[1, 12], [1, 21]])
               # the next turn comes after the engine idled: the period would be idleness, not the step's cost
               + _turn(0.5, 0.030, [[200, 0]]) + _turn(0.531, 0.006, [[1, 200]]) + _turn(0.538, 0.004, [[1, 201]]))
    periods = decode_periods(records)
    assert [(b, ctx) for b, ctx, _ in periods] == [(1, 11), (2, 12 + 21), (1, 201)]
    assert [round(p, 4) for _, _, p in periods] == [0.005, 0.0052, 0.007]


def test_periods_within_spans_or_apart_from_them():
    """within: the turns that start and end inside a span (a prefill pass beside them); apart: the turns that
    overlap none (the same batch's steps around those passes, their baseline in the same minute)."""
    records = [r for i in range(6) for r in _turn(0.005 * i, 0.004, [[1, 10 + i]])]
    spans = [(0.0095, 0.0201)]
    # (a decode row's context is its start_pos + 1; the last turn has no next one: no period)
    assert [ctx for _, ctx, _ in decode_periods(records, within=spans)] == [13, 14]
    assert [ctx for _, ctx, _ in decode_periods(records, apart=spans)] == [11]
    # a turn that straddles a span's edge is neither
    assert [ctx for _, ctx, _ in decode_periods(records, within=[(0.0095, 0.018)])] == [13]
    assert [ctx for _, ctx, _ in decode_periods(records, apart=[(0.0095, 0.018)])] == [11, 15]


def test_turns_with_a_prefill_or_more_than_one_pass_give_no_decode_period():
    two_passes = _turn(0.0, 0.008, [[1, 10]])
    two_passes.append({"kind": "forward", "t_s": 0.004, "dt_s": 0.003, "rows": [[1, 11]]})   # a failed row retried
    records = (two_passes + _turn(0.0085, 0.02, [[64, 0], [1, 11]]) + _turn(0.029, 0.004, [[1, 12]])
               + _turn(0.0335, 0.004, [[1, 13]]))
    assert [(b, ctx) for b, ctx, _ in decode_periods(records)] == [(1, 13)]


def test_no_trace_unless_the_variable_is_set_and_the_trace_is_private(tmp_path, monkeypatch):
    monkeypatch.delenv(step_trace.ENV, raising=False)
    assert step_trace.trace_for("decode-engine") is None
    folder = tmp_path / "steps"
    with step_trace.tracing(folder):
        assert os.environ[step_trace.ENV] == str(folder.resolve())
        trace = step_trace.trace_for("decode-engine")
        trace.write({"kind": "step", "t_s": 1.0, "dt_s": 0.004, "emit_s": 0.0, "outputs": 1})
    assert step_trace.ENV not in os.environ
    assert stat.S_IMODE(trace.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert step_trace.read_trace(folder) == {trace.path.stem: [{"kind": "step", "t_s": 1.0, "dt_s": 0.004,
                                                               "emit_s": 0.0, "outputs": 1}]}
    step_trace._traces.clear()
