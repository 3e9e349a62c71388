"""The orchestrator's blocking face (orchestration/blocking.py): the single server's entry takes each request's
steps, on the request's own thread, from an orchestrator that lives on one event loop thread of the stub."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import numpy as np
import pytest

from trtpd.orchestration.blocking import LoopThread
from trtpd.orchestration.orchestrator import Orchestrator
from trtpd.orchestration.transport import RoleChunk, SamplingInputs
from trtpd.routing.core import InstanceView, Router, RoutingPolicy


class _Fake:
    """Prefill answers [7] with its handle (and logits [1, 1, 1, 4] of 0.7); decode streams 7 again, then 101, 102,
    103, each after `gate` (an asyncio.Event set by the test, or None), each with logits of its token / 1000."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gate: asyncio.Event | None = None
        self.closed_early: list[str] = []
        self.loops: set[int] = set()

    async def stream(self, request_id, request_type, prompt_ids, sampling, handle=None):
        self.loops.add(threading.get_ident())
        ended = False
        try:
            if request_type == "context_only":
                yield RoleChunk([7], handle=b"kv", generation_logits=np.full((1, 1, 1, 4), 0.7))
            else:
                for token in (7, 101, 102, 103):
                    if self.gate is not None and token > 101:
                        await self.gate.wait()
                    yield RoleChunk([token], generation_logits=np.full((1, 1, 1, 4), token / 1000))
            ended = True
            yield RoleChunk([], final=True)
        finally:
            if not ended:
                self.closed_early.append(request_id)

    async def close(self) -> None:
        pass


@pytest.fixture
def loop_thread():
    loop = LoopThread("test-orchestrator")
    yield loop
    loop.stop()


def _steps(loop_thread, clients, request_id="r"):
    router = Router(RoutingPolicy())
    router.update([InstanceView("prefill", "prefill"), InstanceView("decode", "decode")], 0.0)
    orchestrator = Orchestrator("disaggregated", router, clients, first_token_at="prefill")
    return loop_thread.steps(orchestrator.generate(request_id, [1, 2, 3], SamplingInputs(max_new_tokens=4))), router


def test_steps_come_in_order_and_run_on_the_loops_thread_with_their_logits(loop_thread):
    clients = {"prefill": _Fake("prefill"), "decode": _Fake("decode")}
    steps, router = _steps(loop_thread, clients)
    got = list(steps)
    assert [s.token_ids for s in got if s.token_ids] == [[7], [101], [102], [103]]
    # prefill's logits come with its token, decode's with each of its chunks, its repeat of 7 too (as sent)
    assert [float(p.reshape(-1)[0]) for s in got for p in s.generation_logits] == [0.7, 0.007, 0.101, 0.102, 0.103]
    assert clients["decode"].loops == {loop_thread._thread.ident} != {threading.get_ident()}
    assert router.num_tracked_requests == 0


def test_closing_mid_stream_cancels_the_sub_request_and_releases_the_router(loop_thread):
    clients = {"prefill": _Fake("prefill"), "decode": _Fake("decode")}
    steps, router = _steps(loop_thread, clients)
    assert [_next_tokens(steps), _next_tokens(steps)] == [[7], [101]]
    steps.close()                       # a stop word ended it: decode is cancelled before close returns
    assert clients["decode"].closed_early == ["r-d1"]
    assert router.num_tracked_requests == 0
    steps.close()                       # a second close does nothing


def test_cancel_from_another_thread_ends_the_awaited_step_and_the_sub_request(loop_thread):
    """The stub watch (a role model's stub died) cancels a request whose thread waits for a token that never
    comes: the thread gets CancelledError, the sub-request is cancelled, the router forgets the request."""
    clients = {"prefill": _Fake("prefill"), "decode": _Fake("decode")}
    clients["decode"].gate = loop_thread.run(_event())       # never set: token 102 never comes
    steps, router = _steps(loop_thread, clients)
    assert [_next_tokens(steps), _next_tokens(steps)] == [[7], [101]]
    waiting = concurrent.futures.Future()

    def wait_for_next():
        try:
            waiting.set_result(next(steps))
        except BaseException as exc:   # noqa: BLE001 - the test reads what the thread got
            waiting.set_exception(exc)

    threading.Thread(target=wait_for_next, daemon=True).start()
    with pytest.raises(concurrent.futures.TimeoutError):
        waiting.result(timeout=0.2)      # still waiting for 102
    steps.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        waiting.result(timeout=5)
    loop_thread.run(asyncio.sleep(0.05))   # the cancelled task's finally blocks run on the loop
    assert clients["decode"].closed_early == ["r-d1"]
    assert router.num_tracked_requests == 0
    with pytest.raises(concurrent.futures.CancelledError):
        next(steps)                      # a cancelled request has no more steps
    steps.close()


def test_many_threads_share_one_orchestrator_on_one_loop(loop_thread):
    clients = {"prefill": _Fake("prefill"), "decode": _Fake("decode")}
    router = Router(RoutingPolicy())
    router.update([InstanceView("prefill", "prefill"), InstanceView("decode", "decode")], 0.0)
    orchestrator = Orchestrator("disaggregated", router, clients, first_token_at="prefill")
    results: dict[int, list[int]] = {}

    def serve(i: int) -> None:
        steps = loop_thread.steps(orchestrator.generate(f"r{i}", [1, 2], SamplingInputs(max_new_tokens=4)))
        results[i] = [t for s in steps for t in s.token_ids]

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == {i: [7, 101, 102, 103] for i in range(16)}
    assert router.num_tracked_requests == 0 and not orchestrator.holds


def _next_tokens(steps) -> list[int]:
    """The next step with tokens (decode's repeat of prefill's token comes as a step of its logits alone)."""
    while not (step := next(steps)).token_ids:
        pass
    return step.token_ids


async def _event() -> asyncio.Event:
    return asyncio.Event()
