"""The two sides' searches in two processes give the plan the sequential order gives, byte for byte.

Run by tests/integration/test_planner_fork.py in a fresh interpreter (not collected by the suite itself: the name
is not test_*.py): the planner forks only a process that runs no other thread, and the suite's own process has
threads left by earlier tests (gRPC's poller), where these cases could not take the fork path they check."""

import os
import threading

import pytest

from trtpd.planner import parallel
from trtpd.planner.make import VerifyOptions, make_plan
from tests.unit.planner.test_pruning import CASES


@pytest.fixture(autouse=True)
def no_other_thread():
    """Each case starts in a process with no other thread, so the fork path it checks is the one taken."""
    assert threading.active_count() == 1, [t.name for t in threading.enumerate()]


@pytest.mark.parametrize("name", ["budget-70b-fixed", "target-8b-chat-budget"])
def test_parallel_plan_is_the_sequential_plan(name):
    options = VerifyOptions(num_requests=800, compare_requests=300)
    together = make_plan(CASES[name], options)
    in_turn = make_plan(CASES[name], VerifyOptions(num_requests=800, compare_requests=300, parallel=False))
    assert together.comparison is not None
    assert together.to_yaml() == in_turn.to_yaml()


def test_both_runs_the_first_in_a_child_and_recomputes_what_the_child_could_not_send(monkeypatch):
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)   # the fork path runs on a 1-core machine too
    assert parallel.can_fork(), "Linux has fork: the planner's second process must be available"
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


@pytest.mark.parametrize("name", ["budget-70b-fixed", "target-70b-fixed"])
def test_the_plan_quotes_the_unpruned_colocated_search(name):
    """make_plan's colocated side (pruned, in a second process) is the one a plain search of every
    shortlisted candidate to the end finds (with a budget: one within the search's resolution of it),
    with the figures that search gives it."""
    from trtpd.planner import compare
    from trtpd.planner.search import Planner
    from tests.unit.planner.test_pruning import check_pruned_choice, unpruned_sides
    problem = CASES[name]
    plan = make_plan(problem, VerifyOptions(num_requests=800, compare_requests=300))
    planner = Planner(problem)
    rate = problem.target.requests_per_s(planner.stats.mean_tokens_per_request) if problem.target else None
    goodput = compare.Goodput(problem, 300, 0)
    full = compare.colocated_side(planner, goodput, rate, problem.space.max_gpus, prune=False)
    quoted = plan.comparison.colocated
    sides = unpruned_sides(planner, goodput, rate, problem.space.max_gpus)
    check_pruned_choice(quoted.label, quoted.goodput_rate_per_s, full, sides, rate is None)
    own = sides[quoted.label]
    assert (quoted.label, quoted.num_gpus, quoted.goodput_rate_per_s, quoted.static_rate_per_s,
            quoted.slo_attainment, quoted.ttft_s, quoted.tpot_s, quoted.meets_target) == \
        (own.label, own.num_gpus, own.measured.rate_per_s, own.static_rate_per_s,
         own.measured.summary.slo_attainment, own.measured.summary.ttft_s.as_dict(),
         own.measured.summary.tpot_s.as_dict(), own.meets_target)
    assert plan.colocated.num_instances == own.num_instances["colocated"]


def test_a_child_that_does_not_answer_in_time_is_killed_and_its_part_computed_here(monkeypatch):
    import time
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)
    here = os.getpid()
    children = []

    def slow_in_the_child():
        if os.getpid() != here:
            time.sleep(30)                       # stuck, as far as the parent can tell
        return "here"
    real_kill = parallel.os.kill

    def kill(pid, sig):
        children.append(pid)
        real_kill(pid, sig)
    monkeypatch.setattr(parallel.os, "kill", kill)
    t0 = time.monotonic()
    assert parallel.both(slow_in_the_child, lambda: 2, min_wait_s=0.5) == ("here", 2)
    assert time.monotonic() - t0 < 10 and len(children) == 1
    with pytest.raises(ProcessLookupError):      # killed and reaped: no such process any more
        real_kill(children[0], 0)


def test_a_failing_second_part_stops_the_child_at_once(monkeypatch):
    import time
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)
    t0 = time.monotonic()
    with pytest.raises(ZeroDivisionError):
        parallel.both(lambda: time.sleep(30), lambda: 1 / 0)
    assert time.monotonic() - t0 < 10


def test_a_process_running_other_threads_computes_both_here():
    """A forked child inherits the locks other threads hold: with another thread alive the planner does not fork
    (it used to, and a child stuck on such a lock cost the unit tier the 60 s wait for it)."""
    here, stop = os.getpid(), threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        assert not parallel.can_fork()
        assert parallel.both(os.getpid, os.getpid) == (here, here)
    finally:
        stop.set()
        other.join()
    assert parallel.can_fork()
