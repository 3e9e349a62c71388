"""The orchestrator closes a sub-request's stream the moment a request leaves it, passes the instance's own words on
after the routing core's verdict, keeps prefill's own timings over decode's view of them, and maps every
role-model error kind onto the routing core's three; over fake transports."""

from __future__ import annotations

import asyncio

import pytest

from trtpd.orchestration.orchestrator import Orchestrator, OrchestratorError
from trtpd.orchestration.transport import RoleChunk, RoleError, SamplingInputs, routed_kind
from trtpd.routing.core import InstanceView, Router, RoutingPolicy


class _Fake:
    """Prefill answers [7] with its handle and its own timing; decode streams 7 again, then `num_tokens - 1` more,
    with its view of prefill's timing. `fail`: the error it answers with instead."""

    def __init__(self, name: str, num_tokens: int = 4, fail: RoleError | None = None) -> None:
        self.name, self.num_tokens, self.fail = name, num_tokens, fail
        self.closed_early: list[str] = []      # sub-requests closed before their final chunk (cancelled)

    async def stream(self, request_id, request_type, prompt_ids, sampling, handle=None):
        if self.fail is not None:
            raise self.fail
        ended = False
        try:
            if request_type == "context_only":
                yield RoleChunk([7], handle=b"kv", perf={"prefill_compute_s": 0.5})
            else:
                for i in range(self.num_tokens):
                    yield RoleChunk([7 if i == 0 else 100 + i], perf={"prefill_compute_s": 0.0, "kv_transfer_s": 0.1})
            ended = True
            yield RoleChunk([], final=True)
        finally:
            if not ended:
                self.closed_early.append(request_id)

    async def close(self) -> None:
        pass


def _orchestrator(clients) -> Orchestrator:
    router = Router(RoutingPolicy())
    router.update([InstanceView("prefill", "prefill"), InstanceView("decode", "decode")], 0.0)
    return Orchestrator("disaggregated", router, clients, first_token_at="prefill")


def test_closing_mid_stream_cancels_the_sub_request_at_once_and_releases_the_router():
    clients = {"prefill": _Fake("prefill"), "decode": _Fake("decode")}
    orchestrator = _orchestrator(clients)

    async def go():
        steps = orchestrator.generate("r", [1, 2, 3], SamplingInputs(max_new_tokens=4))
        assert (await steps.__anext__()).token_ids == [7]
        assert (await steps.__anext__()).token_ids == [101]      # decode is streaming
        await steps.aclose()                                       # the client left: decode is cancelled now,
        return list(clients["decode"].closed_early)                # not whenever its stream is collected
    assert asyncio.run(go()) == ["r-d1"]
    assert orchestrator.router.num_tracked_requests == 0


def test_prefills_own_timings_win_over_decodes_view_of_them():
    clients = {"prefill": _Fake("prefill"), "decode": _Fake("decode")}

    async def go():
        return [s async for s in _orchestrator(clients).generate("r", [1, 2, 3], SamplingInputs(max_new_tokens=4))]
    steps = asyncio.run(go())
    assert [s.token_ids for s in steps if s.token_ids] == [[7], [101], [102], [103]]
    decode_step = steps[1]
    assert decode_step.perf["prefill_compute_s"] == 0.5 and decode_step.perf["kv_transfer_s"] == 0.1


def test_the_instances_own_words_reach_the_client_with_the_routing_verdict():
    clients = {"prefill": _Fake("prefill"),
               "decode": _Fake("decode", fail=RoleError("KV dtype differs: prefill has fp16, decode has fp8",
                                                         "internal", "decode"))}

    async def go():
        return [s async for s in _orchestrator(clients).generate("r", [1, 2, 3], SamplingInputs(max_new_tokens=4))]
    with pytest.raises(OrchestratorError) as caught:
        asyncio.run(go())
    assert "KV dtype differs: prefill has fp16, decode has fp8" in str(caught.value)
    assert str(caught.value).startswith("decode instance decode failed")   # prefill's token was sent: no retry
    assert caught.value.kind == "internal"


def test_a_refused_prefill_says_why_after_the_verdict():
    clients = {"prefill": _Fake("prefill", fail=RoleError("input_ids: 3000 tokens, above max_input_len 2048",
                                                          "invalid_arg", "prefill")),
               "decode": _Fake("decode")}

    async def go():
        return [s async for s in _orchestrator(clients).generate("r", [1, 2, 3], SamplingInputs(max_new_tokens=4))]
    with pytest.raises(OrchestratorError) as caught:
        asyncio.run(go())
    assert str(caught.value) == ("prefill on prefill failed: invalid argument (not retried: the request is at "
                                 "fault): input_ids: 3000 tokens, above max_input_len 2048")
    assert caught.value.kind == "invalid_arg"


@pytest.mark.parametrize("kind, routed", [("invalid_arg", "invalid_arg"), ("unsupported", "invalid_arg"),
                                          ("unavailable", "unavailable"), ("cancelled", "unavailable"),
                                          ("internal", "internal"), ("not_found", "internal"),
                                          ("unknown", "internal")])
def test_every_role_model_kind_maps_onto_the_routing_cores_three(kind, routed):
    assert routed_kind(kind) == routed
    assert RoleError("x", kind, "i").kind == routed        # the routing core refuses any other kind


def _alive(answers: dict[str, bool], asked: list[str]):
    async def alive(instance: str) -> bool:
        asked.append(instance)
        return answers[instance]
    return alive


def test_an_untagged_decode_failure_is_the_kv_pulls_when_its_prefill_no_longer_answers():
    """TensorRT-LLM fails a generation request whose KV pull failed with words that do not say so (INTERNAL, or
    trtllm-serve's 400): with the prefill instance it pulled from gone, the request is prefilled again elsewhere
    (and that prefill marked unhealthy) instead of failing as decode's fault (decode is tried once)."""
    class _FailsFirst(_Fake):
        def __init__(self, name):
            super().__init__(name)
            self.calls = 0

        async def stream(self, request_id, request_type, prompt_ids, sampling, handle=None):
            self.calls += 1
            if self.calls == 1:
                raise RoleError("Executor failed process requestId 3 due to the following error: transfer failed",
                                "internal", self.name)
            async for chunk in super().stream(request_id, request_type, prompt_ids, sampling, handle):
                yield chunk

    def run(prefill_alive: bool):
        clients = {"prefill-0": _Fake("prefill-0"), "prefill-1": _Fake("prefill-1"), "decode": _FailsFirst("decode")}
        router = Router(RoutingPolicy())
        router.update([InstanceView("prefill-0", "prefill"), InstanceView("prefill-1", "prefill"),
                       InstanceView("decode", "decode")], 0.0)
        asked: list[str] = []
        orchestrator = Orchestrator("disaggregated", router, clients, alive=_alive(
            {"prefill-0": prefill_alive, "prefill-1": True}, asked))

        async def go():
            return [s async for s in orchestrator.generate("r", [1, 2, 3], SamplingInputs(max_new_tokens=4))]
        return asyncio.run(go()), asked, router
    steps, asked, router = run(prefill_alive=False)
    assert asked == ["prefill-0"]
    assert [t for s in steps for t in s.token_ids] == [7, 101, 102, 103]
    assert {s.prefill_instance for s in steps} == {"prefill-1"}
    assert {v.name: v.state for v in router.instances()}["prefill-0"] == "unhealthy"
    with pytest.raises(OrchestratorError, match="decode .*failed"):    # prefill answers: decode's own failure
        run(prefill_alive=True)
