import math

import pytest

from trtpd.perf.model import instance_perf
from trtpd.planner.role_models import DecodeModel, KvLinkModel, PrefillModel, max_batch_for_tpot
from trtpd.planner.search import workload_stats


@pytest.fixture(scope="module")
def stats(chat):
    return workload_stats(chat)


@pytest.fixture(scope="module")
def inst(llama70, h100):
    return instance_perf(llama70, h100, tp=4, weight_dtype="fp8", kv_dtype="fp8")


def test_prefill_batches_grow_with_load(inst, stats):
    pm = PrefillModel(inst, stats, max_num_tokens=8192, bucket_timeout_s=0.005, min_batch_size=2)
    cap = pm.capacity_per_s()
    assert cap == pytest.approx(8192 / pm.batch_s(8192) / stats.input.mean)
    light, heavy = pm.mean_batch_tokens(0.05 * cap), pm.mean_batch_tokens(0.9 * cap)
    assert light == pytest.approx(stats.input.mean)
    assert light < heavy <= 8192
    w_light, own_light = pm.ttft_parts_s(0.05 * cap, 0.9)
    w_heavy, _ = pm.ttft_parts_s(0.9 * cap, 0.9)
    assert w_light < w_heavy
    assert own_light >= pm.batch_s(stats.input.quantile(0.9)) + 0.005
    assert pm.ttft_parts_s(1.01 * cap, 0.9) == (math.inf, math.inf)


def test_decode_fixed_point_obeys_littles_law(inst, stats):
    dm = DecodeModel(inst, stats, max_batch_size=512)
    rate = 20.0
    batch, tpot = dm.mean_batch(rate)
    assert batch == pytest.approx(rate * (stats.output.mean - 1) * tpot, rel=1e-4)
    assert tpot == pytest.approx(dm.step_s(batch), rel=1e-5)
    batch_p, tpot_p = dm.tail(rate, 0.9)
    assert batch_p > batch and tpot_p >= tpot
    assert dm.mean_batch(1e6) == (math.inf, math.inf)       # beyond the batch cap


def test_decode_context_is_time_averaged(inst, stats):
    dm = DecodeModel(inst, stats, 64)
    g = stats.output.mean - 1
    g2 = stats.output.mean_sq - 2 * stats.output.mean + 1
    assert dm.context_mean == pytest.approx(stats.input.mean + g2 / (2 * g))


def test_max_batch_for_tpot_is_the_largest_meeting_it(inst):
    ctx = 800.0
    b = max_batch_for_tpot(inst, ctx, 0.030, kv_batch_limit=10_000)
    assert inst.perf.decode_step_s(b, b * ctx) <= 0.030 < inst.perf.decode_step_s(b + 1, (b + 1) * ctx)
    assert max_batch_for_tpot(inst, ctx, 0.030, kv_batch_limit=7) == 7
    assert max_batch_for_tpot(inst, ctx, 0.001, kv_batch_limit=10_000) == 0


def test_kv_link_fp8_halves_transfer(llama70, stats):
    fp16 = KvLinkModel(50e9, 0.0, llama70.kv_bytes_per_token("fp16"), stats)
    fp8 = KvLinkModel(50e9, 0.0, llama70.kv_bytes_per_token("fp8"), stats)
    # 2048 tokens x 327,680 B = 671 MB at 50 GB/s = 13.4 ms; fp8 6.7 ms
    assert fp16.transfer_s(2048) == pytest.approx(2048 * 327_680 / 50e9)
    assert fp8.transfer_s(2048) == pytest.approx(fp16.transfer_s(2048) / 2)
    assert fp8.required_bytes_per_s(10) == pytest.approx(10 * stats.input.mean * 163_840)
    assert fp16.transfer_p_s(1.0, 0.9) >= fp16.transfer_s(stats.input.quantile(0.9))


def test_prefill_instances_behind_one_router_wait_as_one_queue(inst, stats):
    """The router sends a prompt to the instance with the fewest queued tokens: c instances wait like one
    queue with c servers, less than c queues of one server each at the same load per instance."""
    pm = PrefillModel(inst, stats, max_num_tokens=8192, bucket_timeout_s=0.0, min_batch_size=1)
    rate = 0.8 * pm.capacity_per_s()
    own = pm.ttft_parts_s(rate, 0.9)[1]
    waits = [pm.ttft_parts_s(rate, 0.9, n)[0] for n in (1, 2, 4, 16)]
    assert waits == sorted(waits, reverse=True) and waits[0] > 0
    assert waits[-1] < 0.25 * waits[0]
    assert pm.ttft_parts_s(rate, 0.9, 16)[1] == own                 # its own batch is the same
    assert pm.ttft_parts_s(1.01 * pm.capacity_per_s(), 0.9, 16) == (math.inf, math.inf)
