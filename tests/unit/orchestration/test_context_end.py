"""A request that ends in its context phase, at its first token (its end id, a stop word): the prefill hop says so
(RoleChunk.ended; TensorRT-LLM's Triton backend answers such a context-only request with an error, trtllm-serve with a
"stop" context answer, and each transport reads its own), and the orchestrator ends the request there: its answer is
prefill's (no token for the end id), no decode instance is picked or asked, nothing is given up (nothing was
exported) and the routing core's accounting is released. Upstream's BLS and router fail such a request instead
(docs/twin.md, docs/serve-twin.md)."""

from __future__ import annotations

import asyncio

import pytest

from trtpd.orchestration.orchestrator import Orchestrator
from trtpd.orchestration.transport import RoleChunk, SamplingInputs
from trtpd.routing.core import InstanceView, Router, RoutingPolicy


class _Prefill:
    """Answers that the request ended at its first token, with `tokens` (none for an end id)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    async def stream(self, request_id, request_type, prompt_ids, sampling, handle=None):
        assert request_type == "context_only"
        yield RoleChunk(list(self.tokens), perf={"prefill_compute_s": 0.002}, final=True, ended=True)

    async def close(self) -> None:
        pass


class _Decode:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def stream(self, request_id, request_type, prompt_ids, sampling, handle=None):
        self.calls.append(request_id)
        yield RoleChunk([7], final=True)

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("first_token_at", ["decode", "prefill"])
@pytest.mark.parametrize("tokens", [[], [9]], ids=["end id", "stop word"])
def test_a_request_that_ended_at_its_first_token_in_prefill_never_reaches_decode(first_token_at, tokens):
    router = Router(RoutingPolicy())
    router.update([InstanceView("prefill-0", "prefill"), InstanceView("decode-0", "decode")], 0.0)
    decode = _Decode()
    given_up: list = []
    orch = Orchestrator("disaggregated", router, {"prefill-0": _Prefill(tokens), "decode-0": decode},
                        give_up=lambda instance, sub_id, handle: given_up.append((instance, sub_id, handle)),
                        first_token_at=first_token_at)
    picked: list[str] = []
    pick_decode = router.pick_decode
    router.pick_decode = lambda request_id, *args, **kw: picked.append(request_id) or pick_decode(
        request_id, *args, **kw)

    async def run():
        return [g async for g in orch.generate("r", [1, 2, 3], SamplingInputs(max_new_tokens=8, end_id=2))]
    steps = asyncio.run(run())

    assert [s.token_ids for s in steps] == [tokens]          # one final step: prefill's answer, the whole of it
    assert steps[0].prefill_instance == "prefill-0" and steps[0].decode_instance is None
    assert steps[0].perf == {"prefill_compute_s": 0.002} and steps[0].sub_requests == ("r-p1", "")
    assert picked == [] and decode.calls == []               # decode was neither picked nor asked
    assert given_up == []                                    # nothing was exported, nothing to give up
    assert router.num_tracked_requests == 0 and not orch.holds
