"""Bench summaries: inter-token latency pooled over requests, the worst stall per request, TPOT from the
token count the OpenAI usage reports when chunks carry several tokens."""

import math

from trtpd.bench.client import RequestResult
from trtpd.bench.stats import comparison_table, summarize


def result(rid, sent, times, num_output_tokens=0):
    return RequestResult(rid, 10, sent_s=sent, token_times_s=list(times), num_output_tokens=num_output_tokens)


def test_itl_pools_every_gap_and_the_worst_stall_is_each_requests_longest_gap():
    a = result("a", 0.0, [0.1, 0.11, 0.12, 0.62])    # a 0.5 s stall (a long prefill next door)
    b = result("b", 0.0, [0.2, 0.21, 0.22, 0.23])
    s = summarize("x", [a, b])
    assert math.isclose(s.itl_s.p50, 0.01, abs_tol=1e-9)
    assert math.isclose(s.worst_stall_s.p50, (0.5 + 0.01) / 2, abs_tol=1e-9)   # median of [0.01, 0.5]
    assert math.isclose(s.ttft_s.mean, 0.15, abs_tol=1e-9)
    rows = {r[0]: r[1] for r in comparison_table([s])}
    assert "ITL P50 (ms)" in rows and "worst stall P90 (ms)" in rows


def test_tpot_uses_the_reported_token_count_when_chunks_merge_tokens():
    r = result("a", 0.0, [0.1, 0.2, 0.3], num_output_tokens=5)   # 3 chunks carried 5 tokens
    assert math.isclose(r.tpot_s, 0.2 / 4)
    assert summarize("x", [r]).output_tokens_per_s > 0


def test_errors_are_counted_and_left_out_of_the_percentiles():
    bad = RequestResult("bad", 10, error="APIStatusError: 503")
    s = summarize("x", [result("a", 0.0, [0.1, 0.2]), bad])
    assert s.num_errors == 1 and s.num_requests == 2 and math.isclose(s.ttft_s.p50, 0.1)
