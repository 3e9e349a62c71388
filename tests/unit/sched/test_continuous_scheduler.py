import pytest

from trtpd.sched.block_allocator import BlockAllocator
from trtpd.sched.continuous import BatchSchedulerConfig, ContinuousBatchScheduler, SchedSequence


def seq(i, prompt, new):
    return SchedSequence(f"s{i}", prompt, new)


def test_guaranteed_no_evict_reserves_the_whole_sequence():
    alloc = BlockAllocator(10, 4)
    s = ContinuousBatchScheduler(BatchSchedulerConfig(max_batch_size=8), alloc)
    s.add(seq(0, 8, 12))   # 20 tokens -> 5 blocks for its life, 2 now
    s.add(seq(1, 8, 12))   # another 5
    s.add(seq(2, 4, 4))    # 2 blocks: no room left once the first two are reserved
    plan = s.schedule()
    assert [x.request_id for x in plan.admitted] == ["s0", "s1"]
    assert alloc.num_used_blocks == 4 and s.num_reserved_blocks == 6
    assert not s.can_admit_next()


def test_decode_steps_grow_block_tables_and_finish_frees_them():
    alloc = BlockAllocator(10, 4)
    s = ContinuousBatchScheduler(BatchSchedulerConfig(max_batch_size=8), alloc)
    a = seq(0, 4, 6)
    s.add(a)
    s.schedule()
    a.is_ready = True
    for step in range(5):
        plan = s.schedule()
        assert plan.decode == (a,)
    assert a.num_tokens == 9 and len(a.block_table) == 3
    s.finish(a)
    assert alloc.num_free_blocks == 10 and not s.running


def test_max_batch_size_bounds_running():
    s = ContinuousBatchScheduler(BatchSchedulerConfig(max_batch_size=2), BlockAllocator(100, 4))
    for i in range(4):
        s.add(seq(i, 4, 4))
    assert len(s.schedule().admitted) == 2
    assert len(s.running) == 2 and len(s.waiting) == 2


def test_colocated_mode_bounds_prefill_tokens_per_step():
    s = ContinuousBatchScheduler(BatchSchedulerConfig(max_batch_size=8, max_num_tokens=100, prefill_in_step=True),
                                 BlockAllocator(100, 4))
    s.add(seq(0, 60, 4))
    s.add(seq(1, 60, 4))
    assert [x.request_id for x in s.schedule().admitted] == ["s0"]
    assert [x.request_id for x in s.schedule().admitted] == ["s1"]


def test_a_sequence_that_can_never_fit_is_refused():
    s = ContinuousBatchScheduler(BatchSchedulerConfig(), BlockAllocator(4, 4))
    with pytest.raises(ValueError, match="more KV blocks"):
        s.add(seq(0, 10, 10))


def test_finish_of_a_waiting_sequence_removes_it():
    s = ContinuousBatchScheduler(BatchSchedulerConfig(max_batch_size=1), BlockAllocator(10, 4))
    a, b = seq(0, 4, 4), seq(1, 4, 4)
    s.add(a)
    s.add(b)
    s.schedule()
    s.finish(b)
    assert not s.waiting and list(s.running) == [a]
