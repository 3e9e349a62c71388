"""Roofline numbers for Llama-2-70B on H100 SXM, checked by hand.

Llama-2-70B: 80 layers, hidden 8192, 64 heads (head 128), 8 KV heads, FFN 28672, vocab 32000.
Parameters: embed 32000 x 8192 = 262,144,000; per layer q 67,108,864 + k,v 2 x 8,388,608 + o 67,108,864
+ MLP 3 x 8192 x 28672 = 704,643,072 + norms 16,384 = 855,654,400; x 80 = 68,452,352,000;
+ final norm 8,192 + LM head 262,144,000 + embed 262,144,000 = 68,976,648,192.
H100 SXM profile: BF16/FP16 989.4 TFLOPs, FP8 1978.9 TFLOPs (dense), HBM 3.35 TB/s, NVLink 450 GB/s each way;
efficiencies: compute 0.6, HBM 0.8, link 0.8; all-reduce latency 10 us; overheads prefill 2 ms, decode 1 ms.
"""

import math

import pytest

from trtpd.catalog import get_model
from trtpd.errors import ConfigError
from trtpd.perf.hardware import load_hardware
from trtpd.perf.roofline import RooflinePerfModel

PARAMS = 68_976_648_192


@pytest.fixture(scope="module")
def llama70():
    return get_model("llama-2-70b")


@pytest.fixture(scope="module")
def h100():
    return load_hardware("h100-sxm")


def test_parameter_count(llama70):
    assert llama70.num_params == PARAMS


def test_decode_batch1_tp4_fp16_is_weight_read_bound(llama70, h100):
    r = RooflinePerfModel(llama70, h100, tp=4, weight_dtype="fp16", kv_dtype="fp16")
    b = r.decode_breakdown(1, 0)
    # bytes per GPU: fp16 weights / 4 = 34,488,324,096 + one token's KV shard 2 x 80 x 2 x 128 x 2 = 81,920
    assert b.bytes_per_device == 34_488_324_096 + 81_920
    # at 80% of 3.35 TB/s = 2.68e12 B/s: 12.869 ms (at 100%: the familiar 10.3 ms)
    assert b.memory_s == pytest.approx(34_488_406_016 / 2.68e12)
    assert b.memory_s == pytest.approx(12.869e-3, rel=1e-3)
    # FLOPs: 2 x (params - embedding) = 2 x 68,714,504,192 = 137,429,008,384; / (4 x 989.4e12 x 0.6) = 57.9 us
    assert b.flops == 137_429_008_384
    assert b.compute_s == pytest.approx(57.88e-6, rel=1e-3)
    assert not b.is_compute_bound
    # TP: 2 all-reduces per layer x 80 of 8192 x 2 B; ring moves 2 x 3/4 of it at 360 GB/s, + 10 us each
    assert b.comm_s == pytest.approx(160 * (1.5 * 16384 / 360e9 + 10e-6))
    assert b.total_s == pytest.approx(12.869e-3 + 1.611e-3 + 1.0e-3, rel=1e-3)


def test_prefill_2048_tokens_tp4_fp8_is_compute_bound(llama70, h100):
    r = RooflinePerfModel(llama70, h100, tp=4, weight_dtype="fp8", kv_dtype="fp8")
    b = r.prefill_breakdown(2048)
    # linear: 2 x (params - embed - LM head = 68,452,360,192) x 2048 = 2.8038e14
    # attention (causal): 2 x 80 x 8192 x 2048^2 = 5.4976e12; total 2.8588e14 FLOPs
    assert b.flops == 2 * 68_452_360_192 * 2048 + 2 * 80 * 8192 * 2048 ** 2
    # / (4 x 1978.9e12 x 0.6 = 4.74936e15) = 60.19 ms, i.e. about 34,000 prompt tokens/s per TP4 instance
    assert b.compute_s == pytest.approx(60.19e-3, rel=1e-3)
    # bytes per GPU: fp8 weights / 4 = 17,244,162,048 + 2048 x fp8 KV shard (2 x 80 x 2 x 128 = 40,960)
    assert b.bytes_per_device == 17_244_162_048 + 2048 * 40_960
    assert b.is_compute_bound


def test_fp8_kv_halves_kv_bytes(llama70, h100):
    fp16 = RooflinePerfModel(llama70, h100, tp=4, weight_dtype="fp8", kv_dtype="fp16")
    fp8 = RooflinePerfModel(llama70, h100, tp=4, weight_dtype="fp8", kv_dtype="fp8")
    assert fp16.kv_bytes_per_token_per_device == 2 * fp8.kv_bytes_per_token_per_device == 81_920
    assert fp8.kv_capacity_tokens > 1.9 * fp16.kv_capacity_tokens


def test_kv_capacity_after_weights(llama70, h100):
    r = RooflinePerfModel(llama70, h100, tp=4, weight_dtype="fp16", kv_dtype="fp16")
    # 80 GB x 0.9 usable - 34.49 GB of weights = 37.51 GB; / 81,920 B per token per GPU
    assert r.kv_capacity_tokens == int((72e9 - PARAMS * 2 / 4) // 81_920)
    assert RooflinePerfModel(llama70, h100, tp=1, weight_dtype="fp16").kv_capacity_tokens == 0   # 138 GB > 80 GB


@pytest.mark.parametrize("batch,context", [(1, 0), (1, 4096), (32, 32 * 1024), (256, 256 * 700), (700, 700 * 2048)])
def test_fast_decode_path_equals_breakdown(llama70, h100, batch, context):
    for tp in (1, 2, 8):
        r = RooflinePerfModel(llama70, h100, tp=tp, weight_dtype="fp8", kv_dtype="fp8")
        assert r.decode_step_s(batch, context) == pytest.approx(r.decode_breakdown(batch, context).total_s)


def test_decode_turns_compute_bound_at_large_batch(llama70, h100):
    r = RooflinePerfModel(llama70, h100, tp=4, weight_dtype="fp8", kv_dtype="fp8")
    assert not r.decode_breakdown(8, 8 * 512).is_compute_bound
    assert r.decode_breakdown(1024, 1024 * 16).is_compute_bound


def test_mixed_step_reads_weights_once(llama70, h100):
    r = RooflinePerfModel(llama70, h100, tp=4, weight_dtype="fp8", kv_dtype="fp8")
    assert r.mixed_step_s(0, 0, 16, 16 * 512) == r.decode_step_s(16, 16 * 512)
    mixed = r.mixed_step_s(1024, 1024 ** 2, 16, 16 * 512)
    assert r.prefill_s(1024) < mixed < r.prefill_s(1024) + r.decode_step_s(16, 16 * 512)


def test_fp8_on_a100_is_refused(llama70):
    with pytest.raises(ConfigError, match="no FP8"):
        RooflinePerfModel(llama70, load_hardware("a100-80g"), tp=4, weight_dtype="fp16", kv_dtype="fp8")


def test_tp_must_divide_heads(llama70, h100):
    with pytest.raises(ConfigError, match="tp=3"):
        RooflinePerfModel(llama70, h100, tp=3)


def test_moe_decode_reads_active_weights_at_batch_1_and_all_at_large_batches(h100):
    from trtpd.perf.hardware import load_hardware
    h200 = load_hardware("h200")
    m = get_model("deepseek-v3")
    r = RooflinePerfModel(m, h200, tp=8, weight_dtype="fp8", kv_dtype="fp8")
    one = r.decode_breakdown(1, 0).bytes_per_device
    expected_one = m.num_active_params / 8      # fp8: one byte per parameter, split over 8 devices
    assert one == pytest.approx(expected_one + r.kv_bytes_per_token_per_device, rel=1e-3)
    assert r.decode_breakdown(2048, 0).bytes_per_device == pytest.approx(r.weight_bytes_per_device, rel=0.01)
    # FLOPs follow the active parameters: 2 x ~36.6B per token (LM head included), not 2 x 671B
    flops_per_token = r.decode_breakdown(64, 0).flops / 64
    assert flops_per_token == pytest.approx(2 * (m.num_active_params - m.vocab_size * m.hidden_size), rel=0.01)
    for batch, context in ((1, 6144), (34, 34 * 6400), (256, 256 * 6400)):
        assert r.decode_step_s(batch, context) == pytest.approx(r.decode_breakdown(batch, context).total_s)
    assert r.kv_capacity_tokens > 1_000_000 // 2    # fp8 weights 84 GB per H200, the rest holds MLA latents


@pytest.mark.parametrize("name,hw,tp,weights,kv", [
    ("llama-2-70b", "h100-sxm", 4, "fp16", "fp16"), ("llama-2-70b", "h200", 8, "fp8", "fp8"),
    ("llama-2-7b", "a100-80g", 1, "fp16", "fp16"), ("opt-13b", "a100-80g", 2, "fp16", "fp16"),
    ("deepseek-v3.1", "h200", 8, "fp8", "fp16")])
def test_mixed_step_s_is_the_mixed_breakdown_total_bit_for_bit(name, hw, tp, weights, kv):
    """mixed_step_s is inlined for the simulator; it must give the very float mixed_breakdown's total gives."""
    import random
    r = RooflinePerfModel(get_model(name), load_hardware(hw), tp=tp, weight_dtype=weights, kv_dtype=kv)
    rng = random.Random(0)
    for _ in range(3000):
        p, b = rng.choice([1, 7, 512, 2048, 6144, rng.randint(1, 16384)]), rng.choice([0, 1, 3, 64, rng.randint(0, 512)])
        sq = p * p + 2 * p * rng.choice([0, 0, 1, 2048, rng.randint(0, 20000)])
        ctx = b * rng.choice([1, 100, 700, rng.randint(1, 8000)])
        assert r.mixed_step_s(p, sq, b, ctx) == r.mixed_breakdown(p, sq, b, ctx).total_s, (p, sq, b, ctx)


@pytest.mark.parametrize("name,hw,tp,weights,kv", [
    ("llama-2-70b", "h100-sxm", 4, "fp16", "fp16"), ("llama-2-70b", "h200", 8, "fp8", "fp8"),
    ("llama-2-7b", "a100-80g", 1, "fp16", "fp16"), ("deepseek-v3.1", "h200", 8, "fp8", "fp16")])
def test_step_runs_give_the_step_times_one_by_one_bit_for_bit(name, hw, tp, weights, kv):
    """decode_steps and chunk_steps inline decode_step_s's and mixed_step_s's arithmetic for the simulator's
    runs of steps: the very floats and counts of the generic runs (trtpd.perf.step_runs), which take the steps
    one by one through decode_step_s and mixed_step_s (and equal the event heap's run: test_fast_paths),
    whether the run stops at max_steps or at until_s."""
    import random

    from trtpd.perf import step_runs
    r = RooflinePerfModel(get_model(name), load_hardware(hw), tp=tp, weight_dtype=weights, kv_dtype=kv)
    rng = random.Random(1)
    stops = {"max_steps": 0, "until_s": 0}
    for _ in range(400):
        batch, chunk = rng.choice([1, 3, 64, rng.randint(1, 512)]), rng.choice([1, 40, 512, rng.randint(1, 4096)])
        context, done = batch * rng.randint(1, 8000), rng.choice([0, chunk, rng.randint(0, 20000)])
        end_s, busy_s = rng.uniform(0, 100), rng.uniform(0, 50)
        until_s, max_steps = end_s + rng.choice([0.0, rng.uniform(0, 0.5), math.inf]), rng.choice([0, 1, 5, 40])
        one_by_one = step_runs.decode_steps(lambda c, b=batch: r.decode_step_s(b, c), batch)
        expected = one_by_one(context, end_s, busy_s, until_s, max_steps)
        assert r.decode_steps(batch)(context, end_s, busy_s, until_s, max_steps) == expected
        one_by_one = step_runs.chunk_steps(lambda sq, c, k=chunk, b=batch: r.mixed_step_s(k, sq, b, c), chunk, batch)
        expected = one_by_one(done, context, end_s, busy_s, until_s, max_steps)
        assert r.chunk_steps(chunk, batch)(done, context, end_s, busy_s, until_s, max_steps) == expected
        stops["max_steps" if expected[0] == max_steps else "until_s"] += 1
    assert min(stops.values()) > 20          # both ways a run ends were seen


def test_step_runs_are_kept_per_batch_and_forgotten_when_too_many():
    from trtpd.perf import roofline
    r = RooflinePerfModel(get_model("llama-2-7b"), load_hardware("a100-80g"), tp=1)
    assert r.decode_steps(8) is r.decode_steps(8) and r.chunk_steps(512, 8) is r.chunk_steps(512, 8)
    assert r.chunk_steps(512, 8) is not r.chunk_steps(512, 9)
    for batch in range(roofline.STEP_RUNS_KEPT + 1):
        r.decode_steps(batch + 1)
    assert len(r._decode_runs) <= roofline.STEP_RUNS_KEPT
