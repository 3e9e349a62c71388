"""The orchestrator's blocking face (the single server's BLS runs it from plain threads whose transport blocks),
over fake transports whose stream blocks as a BLS call does."""

from __future__ import annotations

import threading
import time

import pytest

from trtpd.orchestration.blocking import BlockingSteps, LockedRouter
from trtpd.orchestration.orchestrator import Orchestrator, OrchestratorError
from trtpd.orchestration.transport import RoleChunk, RoleError, routed_kind
from trtpd.routing.core import InstanceView, Router, RoutingPolicy

VIEWS = [InstanceView("prefill", "prefill"), InstanceView("decode", "decode")]


class _Blocking:
    """A role model reached by a blocking call: each chunk takes `step_s` of time.sleep (no await). Prefill answers
    [7] with its handle; decode streams 7 again, then `num_tokens - 1` more. `fail`: the error it answers with."""

    def __init__(self, name: str, num_tokens: int = 4, step_s: float = 0.0, fail: RoleError | None = None) -> None:
        self.name, self.num_tokens, self.step_s, self.fail = name, num_tokens, step_s, fail
        self.closed_early: list[str] = []      # sub-requests closed before their final chunk (cancelled)
        self.threads: set[int] = set()

    async def stream(self, request_id, request_type, prompt_ids, sampling, handle=None):
        self.threads.add(threading.get_ident())
        if self.fail is not None:
            raise self.fail
        ended = False
        try:
            if request_type == "context_only":
                time.sleep(self.step_s)
                yield RoleChunk([7], handle=b"kv", perf={"prefill_compute_s": 0.5})
            else:
                assert handle == b"kv"
                for i in range(self.num_tokens):
                    time.sleep(self.step_s)
                    yield RoleChunk([7 if i == 0 else 100 + i], perf={"prefill_compute_s": 0.0, "kv_transfer_s": 0.1})
            ended = True
            yield RoleChunk([], final=True)
        finally:
            if not ended:
                self.closed_early.append(request_id)

    async def close(self) -> None:
        pass


def _steps(router, clients, request_id="r"):
    orchestrator = Orchestrator("disaggregated", router, clients, first_token_at="prefill")
    return BlockingSteps(orchestrator.generate(request_id, [1, 2, 3], _sampling()))


def _sampling():
    from trtpd.orchestration.transport import SamplingInputs
    return SamplingInputs(max_new_tokens=4)


def _router() -> LockedRouter:
    router = LockedRouter(Router(RoutingPolicy()))
    router.update(VIEWS, time.monotonic())
    return router


def test_steps_come_in_order_on_the_callers_thread_and_prefills_timings_win():
    clients = {"prefill": _Blocking("prefill"), "decode": _Blocking("decode")}
    router = _router()
    steps = list(_steps(router, clients))
    assert [s.token_ids for s in steps if s.token_ids] == [[7], [101], [102], [103]]
    assert steps[0].decode_instance is None and steps[1].decode_instance == "decode"
    assert steps[1].perf["prefill_compute_s"] == 0.5 and steps[1].perf["kv_transfer_s"] == 0.1   # decode's view
    assert clients["decode"].threads == {threading.get_ident()}
    assert router.num_tracked_requests == 0


def test_closing_mid_stream_cancels_the_sub_request_and_releases_the_router():
    clients = {"prefill": _Blocking("prefill"), "decode": _Blocking("decode")}
    router = _router()
    steps = _steps(router, clients)
    assert next(steps).token_ids == [7]
    assert next(steps).token_ids == [101]        # decode is streaming
    steps.close()                                 # a stop word ended it: decode is cancelled at once
    assert clients["decode"].closed_early == ["r-d1"]
    assert router.num_tracked_requests == 0
    steps.close()                                 # a second close does nothing


def test_the_instances_own_words_reach_the_client_with_the_routing_verdict():
    clients = {"prefill": _Blocking("prefill"),
               "decode": _Blocking("decode", fail=RoleError("KV dtype differs: prefill has fp16, decode has fp8",
                                                            "internal", "decode"))}
    with pytest.raises(OrchestratorError) as caught:
        list(_steps(_router(), clients))
    assert "KV dtype differs: prefill has fp16, decode has fp8" in str(caught.value)
    assert str(caught.value).startswith("decode instance decode failed")   # prefill's token was sent: no retry
    assert caught.value.kind == "internal"


def test_a_role_model_marked_unhealthy_serves_the_next_request_after_an_update():
    """The single server's BLS updates its router before each request: the one prefill that answered
    "unavailable" once (say, a full queue) is not refused to every later request."""
    router = _router()
    busy = {"prefill": _Blocking("prefill", fail=RoleError("queue full", "unavailable", "prefill")),
            "decode": _Blocking("decode")}
    with pytest.raises(OrchestratorError, match="no other prefill instance is available"):
        list(_steps(router, busy, "a"))
    healthy = {"prefill": _Blocking("prefill"), "decode": _Blocking("decode")}
    with pytest.raises(OrchestratorError, match="no prefill instance is ready"):
        list(_steps(router, healthy, "b"))        # what happens without the update
    router.update(VIEWS, time.monotonic())
    assert [s.token_ids for s in _steps(router, healthy, "c") if s.token_ids] == [[7], [101], [102], [103]]


def test_threads_share_one_router_under_its_lock():
    router = _router()
    results: dict[int, list[int]] = {}

    def serve(i: int) -> None:
        clients = {"prefill": _Blocking("prefill", step_s=0.001), "decode": _Blocking("decode", step_s=0.001)}
        results[i] = [t for s in _steps(router, clients, f"r{i}") for t in s.token_ids]

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(results[i] == [7, 101, 102, 103] for i in range(16)), results
    assert router.num_tracked_requests == 0


@pytest.mark.parametrize("kind, routed", [("invalid_arg", "invalid_arg"), ("unsupported", "invalid_arg"),
                                          ("unavailable", "unavailable"), ("cancelled", "unavailable"),
                                          ("internal", "internal"), ("not_found", "internal"),
                                          ("unknown", "internal")])
def test_every_role_model_kind_maps_onto_the_routing_cores_three(kind, routed):
    assert routed_kind(kind) == routed
    assert RoleError("x", kind, "i").kind == routed        # the routing core refuses any other kind
