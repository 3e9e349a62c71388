"""The two sides' searches in two processes give the plan the sequential order gives, byte for byte."""

import os

import pytest

from trtpd.planner import parallel
from trtpd.planner.make import VerifyOptions, make_plan
from tests.unit.planner.test_pruning import CASES


@pytest.mark.parametrize("name", ["budget-70b-fixed", "target-8b-chat-budget"])
def test_parallel_plan_is_the_sequential_plan(name):
    options = VerifyOptions(num_requests=800, compare_requests=300)
    together = make_plan(CASES[name], options)
    in_turn = make_plan(CASES[name], VerifyOptions(num_requests=800, compare_requests=300, parallel=False))
    assert together.comparison is not None
    assert together.to_yaml() == in_turn.to_yaml()


@pytest.mark.skipif(not parallel.can_fork(), reason="needs fork and two cores")
def test_both_runs_the_first_in_a_child_and_recomputes_what_the_child_could_not_send():
    here = os.getpid()
    assert parallel.both(os.getpid, os.getpid) != (here, here)
    assert parallel.both(os.getpid, os.getpid)[1] == here
    assert parallel.both(os.getpid, os.getpid, parallel=False) == (here, here)

    def only_here():
        if os.getpid() != here:
            raise RuntimeError("fails in the child")
        return "recomputed"
    assert parallel.both(only_here, lambda: 1) == ("recomputed", 1)
    with pytest.raises(ZeroDivisionError):          # an error of its own still surfaces
        parallel.both(lambda: 1 / 0, lambda: 1)
