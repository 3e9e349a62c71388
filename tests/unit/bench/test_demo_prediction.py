"""The main job's prediction (trtpd/bench/run.py predict): the requests the demo sent, simulated for the fleets it
ran (each instance its own tritonserver, the gateway routing by load) on a measured profile, held against what
the run measured, row by row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from trtpd.bench.client import BenchRequest, RequestResult
from trtpd.bench.options import DemoOptions
from trtpd.bench.run import _print_prediction, predict, profile_machine, request_arrays
from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.sim.cluster_specs import options_from_engines
from trtpd.sim.fidelity import fleet_clusters, mape, mirrored_clusters, real_latencies
from trtpd.sim.metrics import latencies
from trtpd.sim.options import ClusterOptions
from trtpd.sim.simulator import simulate

REQUESTS = [BenchRequest(f"req-{i}", "p", out, at, n_in)
            for i, (at, n_in, out) in enumerate([(0.0, 180, 20), (0.31, 900, 40), (0.52, 150, 12), (0.9, 400, 30),
                                                  (1.2, 1500, 25), (1.25, 200, 16)])]


def as_results(requests: list[BenchRequest], ttft_s, tpot_s) -> list[RequestResult]:
    """Results whose first token came ttft_s after sending and whose tokens then came every tpot_s."""
    out = []
    for r, ttft, tpot in zip(requests, ttft_s, tpot_s):
        first = r.send_at_s + ttft
        out.append(RequestResult(r.request_id, r.num_prompt_tokens, sent_s=r.send_at_s,
                                 token_times_s=[first, first + tpot * (r.max_tokens - 1)],
                                 num_output_tokens=r.max_tokens, done=True))
    return out


def test_the_simulated_requests_are_the_ones_sent():
    arrays = request_arrays(REQUESTS)
    assert arrays.arrival_s == [r.send_at_s for r in REQUESTS]
    assert arrays.input_tokens == [180, 900, 150, 400, 1500, 200]
    assert arrays.output_tokens == [20, 40, 12, 30, 25, 16]


def test_the_gateways_colocated_fleet_is_routed_by_load_not_in_turn(fp16_root):
    hardware, model = load_hardware("cpu-reference"), get_model("tiny-llama")
    options = options_from_engines(fp16_root, ClusterOptions(num_colocated=2))
    fleet, mirrored = fleet_clusters(model, hardware, options), mirrored_clusters(model, hardware, options)
    assert fleet["colocated"].routing == "least_loaded" and mirrored["colocated"].routing == "round_robin"
    assert fleet["disaggregated"].decode.num_instances == mirrored["disaggregated"].decode.num_instances == 1
    assert fleet["colocated"].decode.num_instances == 2


def test_a_run_that_went_as_simulated_has_no_error_and_each_mode_is_held_against_its_own(fp16_root):
    hardware, opts = load_hardware("cpu-reference"), DemoOptions(rate_per_s=5.0)
    model = get_model("tiny-llama")
    clusters = fleet_clusters(model, hardware, options_from_engines(fp16_root, ClusterOptions(num_colocated=2)))
    sims = {m: latencies(simulate(c, request_arrays(REQUESTS)), warmup_fraction=0.0) for m, c in clusters.items()}
    results = {m: as_results(REQUESTS, s.ttft_s, s.tpot_s) for m, s in sims.items()}
    rows = predict(opts, fp16_root, hardware, REQUESTS, results)
    assert set(rows) == {"disaggregated", "colocated"}
    for mode in rows:
        assert mape(rows[mode]) == pytest.approx(0.0, abs=1e-9), rows[mode]
    # the modes differ in the simulator, so swapping the runs shows as error: each mode is compared with its own
    swapped = predict(opts, fp16_root, hardware, REQUESTS, {"disaggregated": results["colocated"],
                                                            "colocated": results["disaggregated"]})
    assert mape(swapped["disaggregated"]) > 0.01


def test_a_failed_request_counts_against_the_real_goodput(fp16_root):
    hardware, opts = load_hardware("cpu-reference"), DemoOptions(rate_per_s=5.0)
    results = as_results(REQUESTS, [0.1] * len(REQUESTS), [0.005] * len(REQUESTS))
    results[2].error, results[2].token_times_s = "UNAVAILABLE: the deployment is stopping", []
    lat = real_latencies(results)
    assert np.isnan(lat.ttft_s[2]) and not lat.done[2] and lat.done.sum() == len(REQUESTS) - 1
    rows = {r.name: r for r in predict(opts, fp16_root, hardware, REQUESTS, {"colocated": results})["colocated"]}
    assert rows["goodput/s"].real == pytest.approx(5.0 * 5 / 6)


def test_the_table_names_the_profile_and_how_to_plan_with_it(fp16_root):
    hardware, opts = load_hardware("cpu-reference"), DemoOptions(rate_per_s=5.0, kv_dtype="fp16")
    results = as_results(REQUESTS, [0.1] * len(REQUESTS), [0.005] * len(REQUESTS))
    rows = predict(opts, fp16_root, hardware, REQUESTS, {"disaggregated": results, "colocated": results})
    console = Console(record=True, width=140)
    _print_prediction(console, rows, opts, Path("out/cpu-profile.yaml"))
    text = console.export_text()
    assert "disaggregated: real / simulated" in text and "MAPE" in text and "TTFT P50 (ms)" in text
    assert ("trtpd plan --hardware out/cpu-profile.yaml --model tiny-llama --kv-dtype fp16 --workload cpu-demo"
            in " ".join(text.split()))


def test_a_failed_profile_stops_the_main_job_naming_the_command(tmp_path):
    with pytest.raises(RuntimeError, match=r"profile --backend reference --engine-dir .*nowhere.* failed"):
        profile_machine(tmp_path / "nowhere", tmp_path / "cpu-profile.yaml", Console(quiet=True))
