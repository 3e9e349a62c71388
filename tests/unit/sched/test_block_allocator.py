import pytest

from trtpd.sched.block_allocator import BlockAllocator, num_blocks_for


def test_blocks_for_rounds_up():
    assert [num_blocks_for(n, 32) for n in (0, 1, 32, 33, 64, 65)] == [0, 1, 1, 2, 2, 3]


def test_allocate_and_free_restore_the_count():
    a = BlockAllocator(8, 32)
    ids = a.allocate(5)
    assert len(set(ids)) == 5 and a.num_free_blocks == 3 and a.num_used_blocks == 5
    assert not a.can_allocate(4)
    with pytest.raises(RuntimeError, match="exhausted"):
        a.allocate(4)
    a.free(ids)
    assert a.num_free_blocks == 8 and a.num_used_blocks == 0


def test_double_free_is_caught():
    a = BlockAllocator(4, 16)
    ids = a.allocate(1)
    a.free(ids)
    with pytest.raises(RuntimeError, match="double free"):
        a.free(ids)
