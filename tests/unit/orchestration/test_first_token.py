"""The orchestrator's first-token handling, over fake RoleTransports: a prefill whose answer carries the first
token (TensorRT-LLM's after-prefill transfer) and a decode that streams it again."""

from __future__ import annotations

import asyncio

import pytest

from trtpd.orchestration.orchestrator import Orchestrator, OrchestratorError
from trtpd.orchestration.transport import RoleChunk, RoleError, RoleTransport, SamplingInputs
from trtpd.routing.core import InstanceView, Router, RoutingPolicy


class _Transport:
    """Prefill answers [first] (or nothing) with its handle; decode streams `decode_tokens` one per chunk, or
    fails before its first token (the first decode asked, when `failed` is an empty list)."""

    def __init__(self, name: str, first: list[int], decode_tokens: list[int], failed: list | None = None) -> None:
        self.name, self.first, self.decode_tokens = name, first, decode_tokens
        self.failed = failed      # shared by the decode instances: None, or [] until the first one failed
        self.calls: list[str] = []

    async def stream(self, request_id, request_type, prompt_ids, sampling, handle=None):
        self.calls.append(request_type)
        if request_type == "context_only":
            yield RoleChunk(list(self.first), handle=b"kv", perf={"prefill_compute_s": 0.001}, final=True)
            return
        if self.failed == []:
            self.failed.append(self.name)
            raise RoleError("decode broke before its first token", "internal", self.name, transport=True)
        for i, token in enumerate(self.decode_tokens):
            yield RoleChunk([token], final=i == len(self.decode_tokens) - 1)

    async def close(self) -> None:
        pass


def _run(first_token_at: str, first: list[int], decode_tokens: list[int], num_decode: int = 1,
         fail_first: bool = False) -> tuple[list[list[int]], dict]:
    router = Router(RoutingPolicy(max_decode_attempts=2))
    names = [f"decode-{i}" for i in range(num_decode)]
    router.update([InstanceView("prefill-0", "prefill")] + [InstanceView(n, "decode") for n in names], 0.0)
    clients: dict[str, RoleTransport] = {"prefill-0": _Transport("prefill-0", first, [])}
    failed = [] if fail_first else None
    clients.update({n: _Transport(n, [], decode_tokens, failed) for n in names})
    orch = Orchestrator("disaggregated", router, clients, first_token_at=first_token_at)

    async def all_steps():
        return [g async for g in orch.generate("r", [1, 2, 3], SamplingInputs(max_new_tokens=4))]
    steps = asyncio.run(all_steps())
    return [s.token_ids for s in steps], clients


def test_prefill_first_sends_prefills_token_at_once_and_drops_decodes_repeat():
    steps, _ = _run("prefill", [5], [5, 6, 7])
    assert steps == [[5], [6], [7]]          # 5 once: from prefill, before decode was even asked


def test_decode_first_ignores_prefills_token_and_streams_decode_as_it_is():
    steps, _ = _run("decode", [5], [5, 6, 7])
    assert steps == [[5], [6], [7]]


def test_a_layerwise_prefill_without_a_token_is_the_same_either_way():
    assert _run("prefill", [], [5, 6])[0] == _run("decode", [], [5, 6])[0] == [[5], [6]]


def test_a_decode_whose_repeat_differs_is_an_internal_error():
    with pytest.raises(OrchestratorError, match="first token \\[9\\] differs from prefill's \\[5\\]") as err:
        _run("prefill", [5], [9, 6])
    assert err.value.kind == "internal"


def test_once_prefills_token_is_sent_a_failed_decode_is_not_retried():
    """decode-0 breaks before its first token: with the token still unsent the request is retried elsewhere;
    once the client has it, no retry can continue the answer."""
    steps, clients = _run("decode", [5], [5, 6], num_decode=2, fail_first=True)
    assert steps == [[5], [6]]
    with pytest.raises(OrchestratorError, match="failed mid-stream"):
        _run("prefill", [5], [5, 6], num_decode=2, fail_first=True)


def test_first_token_at_is_checked():
    with pytest.raises(ValueError, match="first_token_at"):
        Orchestrator("disaggregated", Router(RoutingPolicy()), {}, first_token_at="somewhere")
