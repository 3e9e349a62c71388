"""benchmarks/step_account.py request_path: a request's TTFT split at the engines' traced hand-overs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from trtpd.bench.client import RequestResult

_SPEC = importlib.util.spec_from_file_location(
    "step_account", Path(__file__).resolve().parents[3] / "benchmarks" / "step_account.py")
step_account = sys.modules.setdefault("step_account", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(step_account)   # registered first: its dataclasses look their module up


def result(n: int, sent_s: float, first_s: float) -> RequestResult:
    return RequestResult(f"c{n}", n, sent_s=sent_s, token_times_s=[first_s, first_s + 0.01], done=True)


def test_colocated_requests_split_into_intake_engine_and_egress_matched_by_prompt_length():
    traces = {"colocated-engine-7": [
        {"kind": "submit", "t_s": 10.007, "id": "a", "prompt_tokens": 100},
        {"kind": "submit", "t_s": 10.509, "id": "b", "prompt_tokens": 300},
        {"kind": "first", "t_s": 10.047, "id": "a"},
        {"kind": "first", "t_s": 10.609, "id": "b"}],
        "colocated-engine-8": [{"kind": "submit", "t_s": 9.0, "id": "z", "prompt_tokens": 100}]}   # before: not it
    path = step_account.request_path(traces, [result(100, 10.0, 10.052), result(300, 10.5, 10.615)], "colocated")
    assert path["matched"] == 2
    assert path["intake"] == pytest.approx(8.0) and path["engines"] == pytest.approx(70.0)
    assert path["egress"] == pytest.approx(5.5) and path["TTFT"] == pytest.approx(83.5)


def test_disaggregated_requests_end_at_decodes_first_token_and_unmatched_ones_are_left_out():
    traces = {"prefill-engine-1": [{"kind": "submit", "t_s": 1.010, "id": "p1", "prompt_tokens": 50},
                                   {"kind": "first", "t_s": 1.030, "id": "p1"}],
              "decode-engine-2": [{"kind": "submit", "t_s": 1.012, "id": "d1", "prompt_tokens": 50},
                                  {"kind": "first", "t_s": 1.060, "id": "d1"}]}
    failed = RequestResult("c2", 80, sent_s=1.0, error="UNAVAILABLE")
    path = step_account.request_path(traces, [result(50, 1.0, 1.064), failed, result(70, 1.0, 1.2)],
                                     "disaggregated")
    assert path["matched"] == 1
    assert path["intake"] == pytest.approx(10.0) and path["engines"] == pytest.approx(50.0)
    assert path["egress"] == pytest.approx(4.0)
    assert step_account.request_path(traces, [failed], "disaggregated") is None
