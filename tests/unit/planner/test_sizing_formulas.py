"""Seed 000 section 5.3, corrected: each formula's result carries the unit it claims."""

import pytest

from trtpd.catalog import get_model
from trtpd.planner import sizing_formulas


def test_prefill_instances_corrected():
    # seed: 100 x 512 x 0.0005 / 2000 = 0.0128 (units s/token: wrong). Corrected: 100 x 512 / 2000 = 25.6
    assert sizing_formulas.prefill_instances(100, 512, 2000) == pytest.approx(25.6)
    assert sizing_formulas.round_up(25.6) == 26
    # same answer as busy time: rate x tokens x time per token (0.5 ms = 1 / 2000 tokens/s)
    assert sizing_formulas.prefill_instances(100, 512, 2000) == pytest.approx(100 * 512 * 0.0005)


def test_decode_instances_corrected():
    # seed: 500 x 0.02 / 64 = 0.156 (units s: wrong). Corrected: 500 concurrent / 64 per instance = 7.8 -> 8
    assert sizing_formulas.decode_instances(500, 64) == pytest.approx(7.8125)
    assert sizing_formulas.round_up(sizing_formulas.decode_instances(500, 64)) == 8


def test_concurrency_from_littles_law():
    # 10 requests/s x 256 tokens x 20 ms per token = 51.2 sequences in decode
    assert sizing_formulas.concurrent_sequences(10, 256, 0.020) == pytest.approx(51.2)


def test_kv_bandwidth_corrected_and_fp8_halves_it():
    llama = get_model("llama-2-70b")
    fp16, fp8 = llama.kv_bytes_per_token("fp16"), llama.kv_bytes_per_token("fp8")
    assert fp16 == 327_680 == 2 * fp8      # 320 KiB per token, not the seed's 2.5 MB (that is MHA)
    # 50 requests/s x 2048 prompt tokens x 320 KiB, with transfers allowed 50% of the time
    bw16 = sizing_formulas.kv_link_bandwidth_bytes_per_s(50, 2048, fp16, busy_share=0.5)
    assert bw16 == pytest.approx(50 * 2048 * 327_680 / 0.5)          # 67.1 GB/s
    assert sizing_formulas.kv_link_bandwidth_bytes_per_s(50, 2048, fp8, busy_share=0.5) == pytest.approx(bw16 / 2)
    with pytest.raises(ValueError):
        sizing_formulas.kv_link_bandwidth_bytes_per_s(1, 1, 1, busy_share=0)
