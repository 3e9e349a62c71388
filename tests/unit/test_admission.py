"""Admission (trtpd/admission.py), one design with two faces: a bounded number in flight, a bounded queue served in
arrival order, an explicit overload error beyond it. The blocking face (the BLS stub's threads) here; the asyncio
face through the gateway in tests/unit/gateway/test_app.py (bursts, 429 with Retry-After, slots returned)."""

import asyncio
import threading
import time

import pytest

from trtpd.admission import Admission, Overloaded
from trtpd.serving.admission import Slot


def wait_until(cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_requests_beyond_the_inflight_bound_wait_and_enter_as_slots_free():
    adm = Admission(max_inflight=2, max_queued=5)
    first, second = Slot(adm), Slot(adm)
    first.acquire()
    second.acquire()
    entered, third = threading.Event(), Slot(adm)     # (a Slot no one holds any more is released when collected)
    waiter = threading.Thread(target=lambda: (third.acquire(), entered.set()))
    waiter.start()
    wait_until(lambda: adm.num_queued == 1)
    assert not entered.is_set()
    first.release()
    assert entered.wait(5.0)
    waiter.join()
    assert adm.num_inflight == 2 and adm.num_queued == 0


def test_a_full_queue_refuses_at_once_with_the_overload_error():
    adm = Admission(max_inflight=1, max_queued=1)
    held, queued = Slot(adm), Slot(adm)
    held.acquire()
    waiter = threading.Thread(target=queued.acquire)
    waiter.start()
    wait_until(lambda: adm.num_queued == 1)
    with pytest.raises(Overloaded, match=r"overloaded: 1 requests in flight and 1 queued \(limits 1 and 1\); "
                                         r"retry later"):
        Slot(adm).acquire()
    assert adm.num_refused == 1
    held.release()
    waiter.join(5.0)
    assert not waiter.is_alive() and adm.num_inflight == 1


def test_a_wait_past_its_timeout_is_refused_and_leaves_the_queue():
    adm = Admission(max_inflight=1, max_queued=3)
    held = Slot(adm)
    held.acquire()
    with pytest.raises(Overloaded, match="no slot came free"):
        Slot(adm).acquire(timeout_s=0.05)
    assert adm.num_queued == 0 and adm.num_inflight == 1 and adm.num_refused == 1


def test_a_slot_releases_once_whatever_the_exit_path():
    adm = Admission(max_inflight=1, max_queued=0)
    slot = Slot(adm)
    slot.acquire()
    slot.release()
    slot.release()                      # the job's thread and the stub watch may both release it
    Slot(adm).release()                 # one that never held a slot releases nothing
    assert adm.num_inflight == 0
    again = Slot(adm)
    again.acquire()                     # the one slot is free again, exactly once
    with pytest.raises(Overloaded):
        Slot(adm).acquire()
    del again                           # a slot dropped unreleased (a job that vanished) is released when collected
    assert adm.num_inflight == 0


def test_waiters_enter_in_arrival_order_and_a_newcomer_never_overtakes_them():
    """The stub's design before this one woke an arbitrary waiter, and a request arriving as a slot came free
    could take it ahead of every waiter."""
    adm = Admission(max_inflight=1, max_queued=10)
    held = Slot(adm)
    held.acquire()
    order, slots = [], {}

    def wait(i):
        slots[i] = Slot(adm)
        slots[i].acquire()
        order.append(i)
    threads = []
    for i in range(5):
        threads.append(threading.Thread(target=wait, args=(i,)))
        threads[-1].start()
        wait_until(lambda: adm.num_queued == i + 1)
    held.release()                      # the slot passes to waiter 0 at once, inside the release
    with pytest.raises(Overloaded, match="no slot came free"):
        Slot(adm).acquire(timeout_s=0.05)   # a newcomer queues behind the waiters: it does not get it
    for i in range(5):
        wait_until(lambda: len(order) == i + 1)
        slots[i].release()
    for t in threads:
        t.join(5.0)
    assert order == [0, 1, 2, 3, 4]


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
    assert peak[0] <= 3 and adm.num_inflight == 0 and adm.num_refused == 0 and adm.peak_inflight <= 3


async def until(cond) -> None:
    while not cond():
        await asyncio.sleep(0)


def test_the_asyncio_face_reserves_at_admission_and_hands_slots_on_in_order():
    async def go():
        adm = Admission(max_inflight=1, max_queued=2)
        first, second, third = adm.admit(), adm.admit(), adm.admit()
        with pytest.raises(Overloaded):
            adm.admit()
        entered = []

        async def enter(name, ticket):
            await ticket.enter()
            entered.append(name)
        tasks = [asyncio.create_task(enter("third", third)), asyncio.create_task(enter("second", second))]
        await asyncio.sleep(0)                  # both tasks now wait on their tickets
        assert entered == []
        first.release()
        await asyncio.wait_for(until(lambda: entered), 5)
        assert entered == ["second"] and not third.holds_slot
        second.release()
        await asyncio.gather(*tasks)
        third.release()
        return entered, adm.num_inflight, adm.num_queued, adm.peak_queued
    assert asyncio.run(go()) == (["second", "third"], 0, 0, 2)
