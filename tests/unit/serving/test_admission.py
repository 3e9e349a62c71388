"""Admission: a bounded number in flight, a bounded queue, an explicit overload error beyond it."""

import threading

import pytest

from trtpd.serving.admission import Admission, OverloadedError, Slot


def test_requests_beyond_the_inflight_bound_wait_and_enter_as_slots_free():
    adm = Admission(max_inflight=2, max_queued=5)
    adm.enter()
    adm.enter()
    entered = threading.Event()
    waiter = threading.Thread(target=lambda: (adm.enter(), entered.set()))
    waiter.start()
    assert not entered.wait(0.2) and adm.num_queued == 1
    adm.leave()
    assert entered.wait(5.0)
    waiter.join()
    assert adm.num_inflight == 2 and adm.num_queued == 0


def test_a_full_queue_refuses_at_once_with_the_overload_error():
    adm = Admission(max_inflight=1, max_queued=1)
    adm.enter()
    waiter = threading.Thread(target=adm.enter)
    waiter.start()
    while adm.num_queued < 1:
        pass
    with pytest.raises(OverloadedError, match=r"overloaded: 1 requests in flight and 1 queued \(limit 1\); retry later"):
        adm.enter()
    assert adm.num_refused == 1
    adm.leave()
    waiter.join(5.0)
    assert not waiter.is_alive() and adm.num_inflight == 1


def test_a_wait_past_its_timeout_is_refused_and_leaves_the_queue():
    adm = Admission(max_inflight=1, max_queued=3)
    adm.enter()
    with pytest.raises(OverloadedError, match="no slot came free"):
        adm.enter(timeout_s=0.05)
    assert adm.num_queued == 0 and adm.num_inflight == 1


def test_a_slot_releases_once_whatever_the_exit_path():
    adm = Admission(max_inflight=1, max_queued=0)
    slot = Slot(adm)
    slot.acquire()
    slot.release()
    slot.release()
    assert adm.num_inflight == 0
    with pytest.raises(RuntimeError):
        adm.leave()


def test_many_threads_never_exceed_the_inflight_bound():
    adm = Admission(max_inflight=3, max_queued=100)
    peak, lock = [0], threading.Lock()

    def work():
        slot = Slot(adm)
        slot.acquire()
        with lock:
            peak[0] = max(peak[0], adm.num_inflight)
        slot.release()

    threads = [threading.Thread(target=work) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10.0)
    assert peak[0] <= 3 and adm.num_inflight == 0 and adm.num_refused == 0
