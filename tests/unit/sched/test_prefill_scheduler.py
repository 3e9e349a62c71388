import pytest

from trtpd.sched.prefill import PrefillRequest, PrefillScheduler, PrefillSchedulerConfig

CFG = PrefillSchedulerConfig(bucket_boundaries_tokens=(128, 512, 1024), bucket_timeout_s=0.005,
                             min_batch_size=2, max_batch_size=4, max_num_tokens=2048)


def req(i, n, t=0.0):
    return PrefillRequest(f"r{i}", n, t)


def test_a_lone_request_waits_for_the_bucket_timeout():
    s = PrefillScheduler(CFG)
    s.add(req(0, 100, t=0.0))
    assert s.schedule(now_s=0.001) is None
    assert s.next_deadline_s() == pytest.approx(0.005)
    batch = s.schedule(now_s=0.005)
    assert batch.request_ids == ["r0"] and batch.reason == "timeout"


def test_a_bucket_with_min_batch_goes_at_once_and_groups_similar_lengths():
    s = PrefillScheduler(CFG)
    s.add(req(0, 100))
    s.add(req(1, 900))
    s.add(req(2, 120))
    batch = s.schedule(now_s=0.0)
    assert batch.request_ids == ["r0", "r2"] and batch.reason == "full_bucket"
    assert s.num_waiting == 1


def test_cross_bucket_fill_when_traffic_is_sparse():
    s = PrefillScheduler(CFG)
    s.add(req(0, 100, t=0.0))
    s.add(req(1, 300, t=0.001))
    s.add(req(2, 2000, t=0.002))
    batch = s.schedule(now_s=0.0051)
    # r0 timed out alone in its bucket; the neighbouring bucket (r1) fills the minimum batch;
    # r2 does not fit the 2048-token budget
    assert batch.request_ids == ["r0", "r1"] and batch.reason == "cross_bucket_fill"
    assert batch.num_tokens == 400


def test_batches_respect_max_batch_size_and_token_budget():
    s = PrefillScheduler(CFG)
    for i in range(6):
        s.add(req(i, 50))
    assert len(s.schedule(now_s=0.0).requests) == 4
    s2 = PrefillScheduler(CFG)
    for i in range(3):
        s2.add(req(i, 1000))
    batch = s2.schedule(now_s=0.0)
    assert batch.num_tokens <= 2048 and len(batch.requests) == 2


def test_kv_capacity_bounds_the_batch():
    s = PrefillScheduler(CFG)
    s.add(req(0, 100))
    s.add(req(1, 100))
    assert s.schedule(now_s=0.0, max_tokens_available=50) is None
    assert s.schedule(now_s=0.0, max_tokens_available=150).request_ids == ["r0"]


def test_oldest_ready_bucket_goes_first():
    s = PrefillScheduler(CFG)
    s.add(req(0, 700, t=0.0))
    s.add(req(1, 800, t=0.0001))
    s.add(req(2, 100, t=0.001))
    s.add(req(3, 100, t=0.002))
    assert s.schedule(now_s=0.003).request_ids == ["r0", "r1"]


def test_remove_and_oversized_requests():
    s = PrefillScheduler(CFG)
    s.add(req(0, 100))
    assert s.remove("r0") and not s.remove("r0")
    assert s.num_waiting == 0
    with pytest.raises(ValueError, match="never be scheduled"):
        s.add(req(1, 5000))


def test_config_is_validated():
    with pytest.raises(ValueError, match="increasing"):
        PrefillSchedulerConfig(bucket_boundaries_tokens=(512, 128))
    with pytest.raises(ValueError, match="min_batch_size"):
        PrefillSchedulerConfig(min_batch_size=9, max_batch_size=8)
