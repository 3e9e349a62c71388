"""A request's way through the fleet: prefill on one instance, decode on another, as the routing core
decides, with the retries it allows (a KV pull that fails because prefill died is prefilled again
elsewhere). Yields the generated tokens as they arrive; every path releases the router's accounting.
The one orchestrator: the gateway runs it (trtpd/gateway/service.py) for its OpenAI clients and for the fleet's
Triton entry, and the single server's entry (its python stub) through its blocking face (blocking.py), over any
RoleTransport (transport.py). Every sub-request's stream is closed as soon as the request leaves it (a client
gone, a stop word, an error), so the transport cancels it on its instance then, not when the stream is collected.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from contextlib import aclosing
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from trtpd.orchestration.transport import RoleChunk, RoleError, RoleTransport, SamplingInputs
from trtpd.routing.cohorts import Cohort
from trtpd.routing.core import Route, Router

MAX_REGROUPS = 2   # prefills again because the request's cohort moved away from the instance holding its KV


class OrchestratorError(Exception):
    """A request the fleet could not serve; `kind` maps to the HTTP status (invalid_arg 400, unavailable 503,
    overloaded 429, internal 500) and to Triton's error codes at the Triton entry."""

    def __init__(self, message: str, kind: str = "internal") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Generated:
    """One step of a request's output: new tokens, and the TTFT breakdown once known."""

    token_ids: list[int]
    perf: dict[str, float] = field(default_factory=dict)
    prefill_instance: str | None = None
    decode_instance: str | None = None
    generation_logits: list = field(default_factory=list)   # the role instances' logits pieces for these tokens
    # the sub-requests' ids on prefill_instance and decode_instance ("" where none): what a transport that reports
    # a request's timings after it finished (RoleTransport.request_perf) is asked about
    sub_requests: tuple[str, str] = ("", "")


class Orchestrator:
    def __init__(self, mode: str, router: Router, clients: dict[str, RoleTransport],
                 clock: Callable[[], float] = time.monotonic, wait_for_instance_s: float = 0.0,
                 give_up: Callable[[str, str, bytes | None], None] | None = None,
                 first_token_at: str = "decode",
                 alive: Callable[[str], Awaitable[bool]] | None = None) -> None:
        """first_token_at: where the client's first token comes from when prefill's answer carries one (TensorRT-LLM's
        after-prefill transfer; decode then repeats it): "decode" (the default: prefill's token is not sent, decode's
        stream goes as it is, as trtllm-serve's disaggregated server does; a decode that fails before its first
        token can still be retried elsewhere) or "prefill" (sent at once, a shorter TTFT, as the single server's
        BLS does; decode's repeat is checked and dropped; no retry once it is sent). A prefill that answers with
        no token (the reference backend's layerwise transfer) makes the two the same.
        wait_for_instance_s: a request that finds no instance of a role it needs (all busy elsewhere, dead and
        being replaced by the controller, draining) waits this long for one before it fails (503).
        give_up(instance, sub_request_id, handle or None): told (it must not block) of a prefill export that no
        decode will pull: the request ended or moved on first (the client went away, no decode could take it, it
        is prefilled again), so that prefill frees those blocks now rather than at the export's deadline; without
        a handle (the client left while prefill's answer was on its way) by the sub-request's id.
        alive(instance): whether the instance answers now (a fresh probe). TensorRT-LLM says only that a
        generation request failed (INTERNAL on Triton, a 400 from trtllm-serve), whether its KV pull failed because
        the prefill instance it pulled from died or decode itself failed. Before its first token, such a failure is
        read as a KV pull's when the prefill instance no longer answers: it is prefilled again elsewhere (the
        routing core's retry_prefill, that instance marked unhealthy), not failed as decode's.
        """
        if first_token_at not in ("decode", "prefill"):
            raise ValueError(f"first_token_at {first_token_at!r}: expected decode or prefill")
        self.mode = mode
        self.first_token_at = first_token_at
        self.give_up = give_up
        self.alive = alive
        self.wait_for_instance_s = wait_for_instance_s
        self.router = router
        self.clients = clients
        self.clock = clock
        # what each instance holds for this gateway right now, exactly (its own metrics lag): prefill from the
        # pick until decode has pulled the KV (first token) or the request ends; decode while it streams
        self.holds: Counter[str] = Counter()

    async def generate(self, request_id: str, prompt_ids: list[int], sampling: SamplingInputs,
                       cohort: Cohort | None = None) -> AsyncIterator[Generated]:
        """`cohort`: the revision serving this request and the instances it must not use (another
        revision's, during a canary); read again whenever a pick finds nothing."""
        cohort = cohort or Cohort()
        steps = (self._colocated if self.mode == "colocated" else self._disaggregated)(
            request_id, prompt_ids, sampling, cohort)
        try:
            async with aclosing(steps):   # closed with this generator: its sub-request streams close at once
                async for out in steps:
                    yield out
        finally:
            self.router.release(request_id)

    # ---- disaggregated -----------------------------------------------------------------------
    async def _disaggregated(self, request_id: str, ids: list[int], sampling: SamplingInputs, cohort: Cohort):
        attempt, regroups, failed = 1, 0, frozenset()   # failed: instances that failed this request
        sent: list[int] = []     # prefill's first token(s), sent to the client (first_token_at "prefill")
        while True:
            prefill = await self._pick(cohort, lambda ex: self.router.pick_prefill(
                request_id, len(ids), self.clock(), ex | failed))
            if prefill is None:
                raise OrchestratorError("no prefill instance is ready; retry later", "unavailable")
            held = _Holds(self.holds, prefill.instance)
            exported, streamed, sub_id = _Export(), False, f"{request_id}-p{attempt}"
            try:
                try:
                    handle, perf, first, logits, ended = await self._prefill(prefill.instance, sub_id, ids, sampling,
                                                                             exported)
                except RoleError as exc:
                    held.drop(prefill.instance)
                    failed, attempt = self._decide(request_id, "prefill", exc, attempt, failed)
                    continue
                self.router.prefill_done(request_id)
                if ended:
                    # the request ended at its first token (its end id, a stop word): prefill's answer is the whole
                    # of it and no decode is asked. Nothing was exported (a handle that came anyway is given up
                    # below). TensorRT-LLM's own disaggregated BLS and trtllm-serve's router fail such a request
                    # instead (docs/twin.md, docs/serve-twin.md)
                    yield Generated(list(first), dict(perf), prefill.instance, None, logits, (sub_id, ""))
                    return
                if first and self.first_token_at == "prefill":
                    sent = first
                    yield Generated(list(first), dict(perf), prefill.instance, None, logits, (sub_id, ""))
                    logits = []
                repeat = list(first)      # decode streams prefill's token(s) again: dropped when already sent
                # the KV is on prefill.instance: a cohort that now excludes it has no decode that can read it
                decode = await self._pick(cohort, lambda ex: self.router.pick_decode(
                    request_id, len(ids), sampling.max_new_tokens, self.clock(), ex | failed),
                    stranded=lambda ex: prefill.instance in ex)
                if decode is None and prefill.instance in cohort.exclude and regroups < MAX_REGROUPS and not sent:
                    # the split moved on (a rollout promoted or rolled back) while this request was prefilled:
                    # prefill again within the cohort it belongs to now
                    regroups, attempt = regroups + 1, attempt + 1
                    continue
                if decode is None:
                    raise OrchestratorError("no decode instance can take this request now; retry later", "unavailable")
                held.add(decode.instance)
                decode_sub = f"{request_id}-d{attempt}"
                try:
                    async with aclosing(self.clients[decode.instance].stream(
                            decode_sub, "generation_only", ids, sampling, handle=handle)) as chunks:
                        async for chunk in chunks:
                            tokens = chunk.token_ids
                            if tokens and not streamed:
                                self.router.decode_started(request_id)   # its metrics count the request from now on
                                held.drop(prefill.instance)               # the KV is pulled: prefill holds nothing
                                streamed = True
                                if sent:
                                    tokens = self._drop_repeat(tokens, repeat, decode.instance)
                            if chunk.generation_logits is not None:   # decode's, as it sent them (a repeat too)
                                logits = logits + [chunk.generation_logits]
                            if tokens or chunk.final or logits:   # prefill's own timings over decode's view
                                yield Generated(tokens, {**chunk.perf, **perf}, prefill.instance, decode.instance,
                                                logits, (sub_id, decode_sub))
                                logits = []
                    return
                except RoleError as exc:
                    if streamed or sent:   # the client has part of the answer: no retry can continue it
                        raise OrchestratorError(f"decode instance {decode.instance} failed mid-stream: {exc}",
                                           _http_kind(exc.kind)) from None
                    # the decode model's own "unavailable" is a KV pull that failed (prefill gone, export
                    # expired); a decode instance that cannot be reached is decode's failure, not prefill's
                    stage = "kv_pull" if exc.kind == "unavailable" and not exc.transport else "decode"
                    if stage == "decode" and not exc.transport and exc.kind == "internal" and self.alive is not None \
                            and not await self.alive(prefill.instance):
                        # TensorRT-LLM's words do not say which side failed; the prefill instance it pulled from is
                        # gone, so its KV was: prefill again elsewhere
                        stage, exc = "kv_pull", RoleError(f"{exc} (prefill instance {prefill.instance} no longer "
                                                          f"answers)", "unavailable", exc.instance)
                    failed, attempt = self._decide(request_id, stage, exc, attempt, failed,
                                                   culprit=prefill.instance if stage == "kv_pull" else exc.instance)
            finally:
                held.clear()
                # decode streams only once it has pulled the KV: before that, what prefill exported is given up,
                # by its handle, or, when this request was cancelled while prefill's answer was on its way (so
                # the handle never arrived), by the sub-request's id
                if not streamed and self.give_up is not None and (exported.handle is not None or exported.waiting):
                    self.give_up(prefill.instance, sub_id, exported.handle)

    @staticmethod
    def _drop_repeat(tokens: list[int], repeat: list[int], instance: str) -> list[int]:
        """Decode's first tokens are prefill's again (TensorRT-LLM's generation_only answer starts with them):
        checked, then dropped, as they were sent already."""
        if tokens[:len(repeat)] != repeat:
            raise OrchestratorError(f"decode instance {instance}'s first token {tokens[:len(repeat)]} differs from "
                                    f"prefill's {repeat}", "internal")
        return tokens[len(repeat):]

    async def _prefill(self, instance: str, sub_id: str, ids: list[int], sampling: SamplingInputs,
                       exported: "_Export") -> tuple[bytes | None, dict[str, float], list[int], list, bool]:
        """(handle, perf, the token(s) prefill generated if its answer carries them, their logits pieces, whether the
        request ended at its first token: then there is no handle, and the tokens are its whole answer)."""
        handle, perf, first, logits, ended = None, {}, [], [], False
        exported.waiting = True
        try:
            async with aclosing(self.clients[instance].stream(sub_id, "context_only", ids, sampling)) as chunks:
                async for chunk in chunks:
                    handle = exported.handle = chunk.handle or handle
                    perf.update(chunk.perf)
                    first = first or list(chunk.token_ids)
                    ended = ended or chunk.ended
                    if chunk.generation_logits is not None:
                        logits.append(chunk.generation_logits)
        except RoleError:
            exported.waiting = False    # prefill answered with an error: nothing was exported
            raise
        exported.waiting = False
        if handle is None and not ended:
            raise RoleError(f"prefill instance {instance} returned no context_phase_params", "internal", instance)
        return handle, perf, first, logits, ended

    def _decide(self, request_id: str, stage: str, exc: RoleError, attempt: int, failed: frozenset[str],
                culprit: str | None = None) -> tuple[frozenset[str], int]:
        """Asks the routing core what to do about a failed step; raises OrchestratorError unless it retries.
        Returns the instances that failed this request so far, and the next attempt."""
        decision = self.router.on_failure(request_id, stage, exc.kind, attempt, culprit or exc.instance, self.clock())
        limit = self.router.policy.max_decode_attempts if stage == "decode" else self.router.policy.max_prefill_attempts
        if decision.action == "fail" and not (self.wait_for_instance_s > 0 and exc.kind == "unavailable"
                                              and decision.error_kind == "unavailable" and attempt < limit):
            # the routing core's verdict, then the instance's own words (a field-named 400, "KV dtype differs")
            raise OrchestratorError(f"{decision.message}: {exc}" if decision.message else str(exc),
                                    _http_kind(decision.error_kind))
        # a retry, or one whose only obstacle is that no other instance is ready now: the next pick waits for one
        return failed | decision.exclude, attempt + 1

    async def _pick(self, cohort: Cohort, pick: Callable[[frozenset[str]], Route | None],
                    stranded: Callable[[frozenset[str]], bool] | None = None) -> Route | None:
        """The routing core's pick, `pick(excluded instances)`, within the request's cohort. When it finds
        nothing, the cohort is read again (the split may have moved) and the pick asked again, every 50 ms for
        wait_for_instance_s; None at once when `stranded(the cohort's exclusions)` says the request cannot be
        served in its cohort as it stands."""
        route = pick(cohort.exclude)
        deadline = time.monotonic() + self.wait_for_instance_s
        while route is None:
            cohort.refresh()
            if stranded is not None and stranded(cohort.exclude):
                return None
            route = pick(cohort.exclude)
            if route is not None or time.monotonic() >= deadline:
                return route
            await asyncio.sleep(0.05)
        return route

    # ---- colocated ---------------------------------------------------------------------------
    async def _colocated(self, request_id: str, ids: list[int], sampling: SamplingInputs, cohort: Cohort):
        attempt, failed = 1, frozenset()
        while True:
            route = await self._pick(cohort, lambda ex: self.router.pick_colocated(
                request_id, len(ids), sampling.max_new_tokens, self.clock(), ex | failed))
            if route is None:
                raise OrchestratorError("no colocated instance can take this request now; retry later", "unavailable")
            streamed = False
            held = _Holds(self.holds, route.instance)
            try:
                sub_id = f"{request_id}-c{attempt}"
                async with aclosing(self.clients[route.instance].stream(sub_id, "", ids, sampling)) as chunks:
                    async for chunk in chunks:
                        if chunk.token_ids and not streamed:
                            self.router.prefill_done(request_id)
                            self.router.decode_started(request_id)
                        logits = [] if chunk.generation_logits is None else [chunk.generation_logits]
                        if chunk.token_ids or chunk.final or logits:
                            streamed = streamed or bool(chunk.token_ids)
                            yield Generated(chunk.token_ids, chunk.perf, None, route.instance, logits, ("", sub_id))
                return
            except RoleError as exc:
                if streamed:
                    raise OrchestratorError(f"instance {route.instance} failed mid-stream: {exc}",
                                       _http_kind(exc.kind)) from None
                failed, attempt = self._decide(request_id, "decode", exc, attempt, failed)
            finally:
                held.clear()


@dataclass
class _Export:
    """Where a prefill's handle lands the moment it arrives (the request may be cancelled before _prefill returns),
    and whether prefill's answer was still awaited."""

    handle: bytes | None = None
    waiting: bool = False


class _Holds:
    """One request's entries in the orchestrator's per-instance holds; each dropped exactly once."""

    def __init__(self, holds: Counter, first: str) -> None:
        self.holds = holds
        self.names: list[str] = []
        self.add(first)

    def add(self, name: str) -> None:
        self.holds[name] += 1
        self.names.append(name)

    def drop(self, name: str) -> None:
        if name in self.names:
            self.names.remove(name)
            self.holds[name] -= 1
            if self.holds[name] <= 0:
                del self.holds[name]

    def clear(self) -> None:
        for name in list(self.names):
            self.drop(name)


def _http_kind(kind: str) -> str:
    return kind if kind in ("invalid_arg", "unavailable", "internal") else "internal"


__all__ = ["Orchestrator", "Generated", "OrchestratorError", "RoleChunk"]
