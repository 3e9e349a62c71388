"""The bench report from synthetic results: goodput (DistServe's definition), per-rate tables, the Markdown
report with its PNG plots, and the JSON round trip."""

import json
import math

import pytest

from trtpd.bench.client import RequestResult
from trtpd.bench.report import (BenchRun, Sweep, TargetInfo, from_json, goodput_rate, goodput_table, markdown,
                                rate_table, read_json, to_json, write_json, write_report)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def result(rid: str, sent: float, ttft: float, gap: float, n: int = 5, error: str | None = None) -> RequestResult:
    times = [] if error else [sent + ttft + i * gap for i in range(n)]
    return RequestResult(rid, 20, sent_s=sent, token_times_s=times, text="x" * n, error=error, done=True,
                         perf={"prefill_queue_ms": 1.5} if not error else {})


def run_with(target: str, rate: float, ttfts: list[float], gap: float = 0.02, t0: float = 1000.0) -> BenchRun:
    return BenchRun(target, rate, [result(f"req-{i}", t0 + i / rate, ttft, gap) for i, ttft in enumerate(ttfts)])


def sweep(slo: bool = True) -> Sweep:
    s = Sweep("cpu-demo", "gamma", 2.0, 10, 0, 0.5 if slo else None, 0.05 if slo else None, 0.9,
              [TargetInfo("disagg (disaggregated)", "openai", "http://127.0.0.1:1/v1", "disaggregated"),
               TargetInfo("coloc (colocated)", "openai", "http://127.0.0.1:2/v1", "colocated")], [1.0, 2.0, 4.0])
    # disagg: 10/10, 9/10, 5/10 meet TTFT <= 0.5 s -> goodput 2/s; coloc: 10/10, 8/10, 10/10 -> goodput 1/s
    # (4/s attains again, but 2/s already missed: the range ends there)
    for rate, good in ((1.0, 10), (2.0, 9), (4.0, 5)):
        s.runs.append(run_with("disagg (disaggregated)", rate, [0.1] * good + [0.9] * (10 - good)))
    for rate, good in ((1.0, 10), (2.0, 8), (4.0, 10)):
        s.runs.append(run_with("coloc (colocated)", rate, [0.2] * good + [1.2] * (10 - good), gap=0.03))
    return s


def test_goodput_is_the_highest_rate_up_to_which_every_measured_rate_attains_the_target():
    assert goodput_rate([(1, 1.0), (2, 0.9), (4, 0.5)], 0.9) == 2
    assert goodput_rate([(4, 1.0), (1, 1.0), (2, 0.8)], 0.9) == 1      # order does not matter; 4 comes after a miss
    assert goodput_rate([(1, 0.89)], 0.9) is None
    assert goodput_rate([], 0.9) is None
    s = sweep()
    assert s.goodput_rate("disagg (disaggregated)") == 2.0
    assert s.goodput_rate("coloc (colocated)") == 1.0
    assert math.isclose(s.goodput_requests_per_s("disagg (disaggregated)", 4.0), 4.0 * 0.5)
    assert math.isclose(s.goodput_requests_per_s("coloc (colocated)", 2.0), 2.0 * 0.8)


def test_tpot_half_of_the_slo_counts_too():
    s = sweep()
    s.runs = [run_with("disagg (disaggregated)", 1.0, [0.1] * 10, gap=0.06)]   # TTFT fine, TPOT 60 ms > 50 ms
    assert s.summary("disagg (disaggregated)", 1.0).slo_attainment == 0.0
    assert s.goodput_rate("disagg (disaggregated)") is None


def test_rate_table_has_percentiles_attainment_and_goodput_per_target():
    rows = rate_table(sweep(), 2.0)
    assert rows[0] == ["metric", "disagg (disaggregated)", "coloc (colocated)"]
    by_name = {r[0]: r[1:] for r in rows[1:]}
    for metric in ("TTFT", "ITL", "TPOT", "worst stall"):
        for p in ("P50", "P90", "P99"):
            assert f"{metric} {p} (ms)" in by_name
    assert by_name["ITL P50 (ms)"] == ["20.0", "30.0"]
    assert by_name["TTFT P50 (ms)"] == ["100.0", "200.0"]
    assert by_name["SLO attainment"] == ["90%", "80%"]
    assert by_name["goodput (req/s) = rate x attainment"] == ["1.80", "1.60"]
    assert "output tokens/s" in by_name
    g = goodput_table(sweep())
    assert g[1][:2] == ["disagg (disaggregated)", "2"] and g[2][:2] == ["coloc (colocated)", "1"]
    assert g[1][2:] == ["100%", "90%", "50%"]


def test_report_writes_markdown_and_non_empty_pngs_it_links(tmp_path):
    s = sweep()
    files = write_report(s, tmp_path / "out" / "bench.md")
    md = (tmp_path / "out" / "bench.md").read_text()
    pngs = [f for f in files if f.suffix == ".png"]
    assert {f.name for f in pngs} == {"bench-rate-1-cdf.png", "bench-rate-2-cdf.png", "bench-rate-4-cdf.png",
                                      "bench-goodput.png"}
    for f in pngs:
        data = f.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, f
        assert f"]({f.name})" in md
    for rate in ("1", "2", "4"):
        assert f"## {rate} requests/s" in md
    assert "| disagg (disaggregated) | 2 | 100% | 90% | 50% |" in md
    assert "Gamma (CV 2)" in md and "TTFT <= 500 ms and TPOT <= 50 ms" in md


def test_report_without_slos_has_no_goodput_plot(tmp_path):
    files = write_report(sweep(slo=False), tmp_path / "r.md")
    assert [f.name for f in files] == ["r.md", "r-rate-1-cdf.png", "r-rate-2-cdf.png", "r-rate-4-cdf.png"]
    assert "No SLOs given" in markdown(sweep(slo=False))


def test_a_target_whose_requests_all_failed_still_reports(tmp_path):
    s = sweep()
    s.runs.append(BenchRun("extra", 1.0, [result("a", 0.0, 0, 0, error="APIConnectionError: refused")]))
    s.targets.append(TargetInfo("extra", "openai", "http://127.0.0.1:3/v1"))
    files = write_report(s, tmp_path / "r.md")
    assert all(f.stat().st_size > 0 for f in files)
    rows = {r[0]: r[1:] for r in rate_table(s, 1.0)}
    assert rows["requests (errors)"][-1] == "1 (1)" and rows["SLO attainment"][-1] == "0%"
    d = to_json(s)
    json.dumps(d, allow_nan=False)     # NaN percentiles of an empty set are null in JSON


def test_json_round_trip_keeps_every_request_and_the_summaries(tmp_path):
    s = sweep()
    path = write_json(s, tmp_path / "b.json")
    back = read_json(path)
    assert to_json(back) == to_json(from_json(json.loads(path.read_text())))
    assert back.targets == s.targets and back.rates == s.rates
    assert (back.ttft_slo_s, back.tpot_slo_s, back.attainment_target, back.cv) == (0.5, 0.05, 0.9, 2.0)
    for run in s.runs:
        a, b = s.summary(run.target, run.rate_per_s), back.summary(run.target, run.rate_per_s)
        assert b.num_requests == a.num_requests and b.slo_attainment == a.slo_attainment
        for attr in ("ttft_s", "itl_s", "tpot_s", "worst_stall_s"):
            assert getattr(b, attr).p99 == pytest.approx(getattr(a, attr).p99, abs=1e-9)
        assert b.breakdown_ms == a.breakdown_ms
    d = json.loads(path.read_text())
    assert d["goodput_rate_per_s"] == {"disagg (disaggregated)": 2.0, "coloc (colocated)": 1.0}
    assert d["runs"][0]["requests"][0]["sent_s"] == 0.0          # seconds from the run's first send
    assert len(d["summaries"]) == 6 and d["summaries"][1]["goodput_requests_per_s"] == pytest.approx(1.8)
    with pytest.raises(ValueError, match="version"):
        from_json({**d, "version": 99})
