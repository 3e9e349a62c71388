"""`trtpd profile --serving`'s probe (trtpd/bench/serving_probe.py) on the real disaggregated fleet: the main job
(`trtpd demo`) and benchmarks/validate_sim.py run it first, so a probe that cannot finish on the real servers stops
both. Its fits are unit-tested on synthetic traces (tests/unit/bench/test_serving_probe.py); here every term comes
out of real tritonserver deployments, step traces and lone requests."""

from __future__ import annotations

import os

from trtpd.bench.serving_probe import measure_serving_overhead
from trtpd.perf.hardware import load_hardware


def _curves_only():
    """The bundled profile's curves, which stand for the profile's (the probe reads the server against whichever
    curves it is given), without the serving terms it measures."""
    hardware = load_hardware("cpu-reference")
    return hardware.model_copy(update={"measured": [m.model_copy(update={"serving": {}}) for m in hardware.measured]})


def test_the_disaggregated_probe_measures_every_serving_term_through_the_real_server(trtpd_home, fp16_root):
    hardware = _curves_only()
    said: list[str] = []
    overhead = measure_serving_overhead(fp16_root, hardware, "disaggregated", progress=said.append)
    assert overhead.host_cores == len(os.sched_getaffinity(0))
    assert overhead.serving_cpu_per_token_s > 0 and overhead.per_sequence_step_s > 0
    # the server's work per request (measured 8-12 ms on the 2-core reference fleet) is read, not left at 0
    assert 0.001 < overhead.serving_cpu_per_request_s < 0.2 and "ms per request (lone requests of 2 tokens)" in said[0]
    assert overhead.step_cores >= 1.0 and 0 < overhead.prefill_weight <= 1.0
    assert 0.5 < overhead.prefill_compute_scale < 2.0 and 0.0 <= overhead.prefill_pass_s < 0.05
    # the prefill beside the decode batch: both slowdowns read against their baselines in the same minute (the
    # prefill alone just before, the decode steps apart from its passes), and the weight from them
    assert len(said) == 1 and "the decode steps x" in said[0] and "prefill weight" in said[0], said
    # the prefill pass in the server: a line through three prompt lengths, each pass read from the trace
    assert "a prompt of 128/256/512 tokens alone: the prefill pass" in said[0] and "ms a pass" in said[0], said


def test_the_colocated_probe_reads_a_pair_at_three_loads_and_a_prompt_beside_a_decode_through_the_real_server(trtpd_home, fp16_root):
    hardware = _curves_only()
    said: list[str] = []
    overhead = measure_serving_overhead(fp16_root, hardware, "colocated", progress=said.append)
    assert overhead.host_cores == len(os.sched_getaffinity(0))
    assert overhead.step_cores >= 1.0 and 0 < overhead.prefill_weight <= 1.0
    # a prompt alone in its pass on one instance beside the other's decode: its own step cores and weight
    assert overhead.prefill_step_cores is not None and overhead.prefill_step_cores >= 1.0
    assert "-token prompt on one beside a decode of 1 on the other: the prompt x" in said[0], said
    # the pair at 1, 2 and 4 each, read from the trace: the serving path's share per token is the slope of a line
    # through them, at most the CPU it spends (printed beside it)
    assert len(said) == 1 and "two colocated instances decoding 1, 2, 4 each: x" in said[0], said
    spent_ms = float(said[0].split("the serving path's CPU ")[1].split(" ms per token")[0])
    assert 0 <= overhead.serving_cpu_per_token_s * 1e3 <= spent_ms + 0.005
