"""One sub-request to a trtllm-serve worker over its OpenAI HTTP API: the second RoleTransport
(trtpd/orchestration/transport.py), the one TensorRT-LLM's PyTorch path needs. The gateway reaches real
trtllm-serve workers and trtpd's twin of them (trtpd/serve_twin) with it.

The two hops are those of upstream's router (`openai_disagg_service.py`, TensorRT-LLM 1.2.1; the field names in
trtpd/schema/trtllm_serve.py):
- context_only: `/v1/completions`, not streamed, `disaggregated_params` {request_type: context_only}; its one
  choice's `disaggregated_params` become the handle (serialized here together with the choice's finish_reason
  and tokens), its tokens (`first_gen_tokens`) the chunk's token_ids;
- generation_only: the same request streamed, the prompt as token ids, with those `disaggregated_params` and
  request_type generation_only;
- "" (a worker that serves both phases): the request streamed, without `disaggregated_params`.
A context answer whose finish_reason is neither "length" nor "not_finished" ended the request at its first token
(upstream's `_need_gen`): the context hop says so (RoleChunk.ended, no handle) and the orchestrator asks no
generation server. Such an answer has no ctx_request_id (upstream's PyTorch executor keeps the request's own
disaggregated_params and sends no KV), which upstream's router refuses (`_verify_ctx_response`); trtpd serves it.
Every request asks `detokenize: false`, so each choice carries `token_ids` (the gateway detokenizes), and
`ignore_eos` when the orchestrator sends end_id -1 (trtllm-serve stops at its tokenizer's EOS otherwise).
A client's `disaggregated_params` never reach here: the gateway's schemas refuse the field.

Timings: a worker started with `return_perf_metrics` keeps a record per finished request, handed out once at
`/perf_metrics` (openai_server.py `get_perf_metrics`; trtpd/schema/trtllm_serve.py). `request_perf` reads them after
the sub-request ended (one read serves every sub-request that finished before it started) and matches them by
ctx_request_id: the context worker's become the prefill queue and compute, the generation worker's the decode queue
and the KV transfer (time and bytes) of the gateway's TTFT breakdown.

Errors: trtllm-serve answers every failed request 400 with a flat ErrorResponse (`create_error_response`,
openai_server.py), a KV transfer that failed as much as a bad field, so a 4xx for a request the gateway validated
is a server fault ("internal": retried elsewhere); a worker that cannot be reached, or a 5xx, is "unavailable".
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator

import httpx
import numpy as np

from trtpd.kv.auth import orchestrator_token
from trtpd.orchestration.transport import RoleChunk, RoleError, SamplingInputs
from trtpd.routing.core import InstanceView
from trtpd.schema.trtllm_serve import (AUTH_HEADER, CONTEXT_ONLY, GENERATION_ONLY, GO_ON_TO_GENERATION,
                                       DisaggregatedParams, ProtocolError, RequestTimings, context_phase_perf,
                                       error_message, generation_phase_perf, read_perf_record)

CONNECT_TIMEOUT_S = 5.0
UNKNOWN_FREE_BLOCKS = 1 << 30      # a worker that has run no iteration yet: empty, its size not yet known
METRICS_TIMEOUT_S = 1.0
MAX_PERF_KEPT = 4096       # sub-requests whose timings are awaited, and records read but not yet asked for


def request_body(model: str, prompt_ids: list[int], sampling: SamplingInputs, stream: bool,
                 disaggregated_params: DisaggregatedParams | None) -> dict:
    """A `/v1/completions` body in trtllm-serve's CompletionRequest fields. Sampling fields the orchestrator leaves
    at their defaults are not sent (a real 1.2.1 worker refuses fields it does not know)."""
    body = {"model": model, "prompt": list(prompt_ids), "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "stream": stream, "detokenize": False}
    if sampling.seed:
        body["seed"] = sampling.seed
    if sampling.end_id < 0:
        body["ignore_eos"] = True
    if disaggregated_params is not None:
        body["disaggregated_params"] = {k: v for k, v in disaggregated_params.to_dict().items() if v is not None}
    return body


def context_handle(choice: dict) -> bytes:
    """The handle a context answer gives the orchestrator: its disaggregated_params, finish_reason and tokens."""
    return json.dumps({"disaggregated_params": choice.get("disaggregated_params"),
                       "finish_reason": choice.get("finish_reason"),
                       "token_ids": choice.get("token_ids") or []}).encode()


def ended_chunk(choice: dict, end_id: int) -> RoleChunk:
    """A context answer that ended the request at its first token (finish_reason "stop": its end id or a stop word)
    as the whole answer: its tokens, the end id left out, for TensorRT-LLM never outputs it on the C++ path (the
    samplers' "Do not increase seq len when EOS is generated", docs/twin.md) while the PyTorch path's TorchSampler
    adds it to the sequence, so an answer may end with it (not verified); trtpd's clients never see or count it.
    No handle: the worker sent no KV (py_executor _send_disagg_ctx_cache) and none is to be given up."""
    tokens = [int(t) for t in choice.get("token_ids") or []]
    if end_id >= 0 and tokens and tokens[-1] == end_id:
        tokens = tokens[:-1]
    return RoleChunk(tokens, final=True, ended=True)


def read_handle(handle: bytes, instance: str) -> tuple[DisaggregatedParams, str | None, list[int]]:
    try:
        data = json.loads(handle)
        params = DisaggregatedParams.from_dict(data["disaggregated_params"])
        return params, data.get("finish_reason"), [int(t) for t in data.get("token_ids") or []]
    except (ValueError, KeyError, TypeError, ProtocolError) as exc:
        raise RoleError(f"instance {instance}: not a context answer of trtllm-serve ({exc})", "internal",
                        instance) from None


def opaque_state(handle: bytes) -> bytes | None:
    """The engine's opaque state in a handle: on trtpd's twin, its signed KV handle (give-ups need it)."""
    try:
        return DisaggregatedParams.from_dict(json.loads(handle)["disaggregated_params"]).opaque_state()
    except (ValueError, KeyError, TypeError, ProtocolError):
        return None


def view_from_stats(name: str, role: str, stats: dict) -> InstanceView:
    """An iteration-stats entry of `/metrics` (IterationStats JSON: numQueuedRequests, numActiveRequests,
    maxNumActiveRequests, kvCacheStats {maxNumBlocks, freeNumBlocks, tokensPerBlock}, inflightBatchingStats
    {numPausedRequests}) as the routing core's view."""
    kv = stats.get("kvCacheStats") or {}
    paused = (stats.get("inflightBatchingStats") or {}).get("numPausedRequests", 0)
    return InstanceView(name=name, role=role, waiting=int(stats.get("numQueuedRequests", 0)) + int(paused or 0),
                        active=int(stats.get("numActiveRequests", 0)), free_kv_blocks=int(kv.get("freeNumBlocks", 0)),
                        max_kv_blocks=int(kv.get("maxNumBlocks", 0)),
                        max_batch_size=int(stats.get("maxNumActiveRequests", 0)),
                        tokens_per_block=int(kv.get("tokensPerBlock", 32)) or 32)


class ServeClient:
    """A connection pool to one trtllm-serve worker: a RoleTransport, and its load probe.
    key: the deployment key that signs the orchestrator's proof (x-trtpd-auth), which trtpd's twin requires; a real
    trtllm-serve ignores the header. None: no proof is sent."""

    def __init__(self, name: str, url: str, model: str, key: bytes | None) -> None:
        self.name = name
        self.url = url if url.startswith(("http://", "https://")) else f"http://{url}"
        self.model = model
        self.key = key
        # no read timeout: a long generation streams for minutes; the orchestrator cancels by closing the stream
        self.client = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S))
        self._view: InstanceView | None = None
        # /perf_metrics: sub-request id -> [ctx_request_id, phase, when it finished here]; records read, by
        # ctx_request_id (a list: the ids are per context worker, so two of them can name the same one; the oldest
        # record is taken first)
        self._awaited: OrderedDict[str, list] = OrderedDict()
        self._records: dict[int, deque[RequestTimings]] = {}
        self._num_records = 0
        self._perf_lock = asyncio.Lock()
        self._perf_read_s = float("-inf")

    reports_perf_later = True   # upstream's /perf_metrics: a record once a request finished, handed out once

    async def close(self) -> None:
        await self.client.aclose()

    def kv_handle(self, handle: bytes) -> bytes | None:
        return opaque_state(handle)

    # ---- timings: upstream's /perf_metrics (needs return_perf_metrics and perf_metrics_max_requests > 0) -------
    def _await_perf(self, request_id: str, ctx_request_id: int | None, phase: str) -> None:
        if ctx_request_id is None:
            return
        self._awaited[request_id] = [int(ctx_request_id), phase, time.monotonic()]
        while len(self._awaited) > MAX_PERF_KEPT:
            self._awaited.popitem(last=False)

    def _finished(self, request_id: str) -> None:
        """The sub-request's answer ended here: the worker recorded it before (upstream appends the record before
        the response ends), so any read that starts from now on finds it."""
        if request_id in self._awaited:
            self._awaited[request_id][2] = time.monotonic()

    async def request_perf(self, request_id: str) -> dict[str, float]:
        """The TTFT phases of a finished sub-request from the worker's /perf_metrics record of it: a context
        worker's queue and compute, a generation worker's queue and KV transfer. One read hands out every record
        since the last one, so reads are shared: those not asked for yet are kept. {} when the worker keeps no
        records (return_perf_metrics off), does not answer, or another reader took this one."""
        awaited = self._awaited.pop(request_id, None)
        if awaited is None:
            return {}
        ctx_request_id, phase, finished_s = awaited
        timings = self._take(ctx_request_id)
        if timings is None:
            await self._read_perf(finished_s)
            timings = self._take(ctx_request_id)
        if timings is None:
            return {}
        return context_phase_perf(timings) if phase == CONTEXT_ONLY else generation_phase_perf(timings)

    def _take(self, ctx_request_id: int) -> RequestTimings | None:
        kept = self._records.get(ctx_request_id)
        if not kept:
            return None
        timings = kept.popleft()
        self._num_records -= 1
        if not kept:
            del self._records[ctx_request_id]
        return timings

    async def _read_perf(self, finished_s: float) -> None:
        """One GET /perf_metrics, unless one that started after `finished_s` already ran (waiting for it instead):
        the records of sub-requests that finished together come from one read."""
        async with self._perf_lock:
            if self._perf_read_s >= finished_s:
                return
            self._perf_read_s = time.monotonic()
            try:
                r = await self.client.get("/perf_metrics", timeout=METRICS_TIMEOUT_S)
                items = r.json() if r.status_code == 200 else []
            except (httpx.HTTPError, ValueError):
                return
            for item in items if isinstance(items, list) else []:
                record = read_perf_record(item)
                if record is None:
                    continue
                self._records.setdefault(record[0], deque()).append(record[1])
                self._num_records += 1
            while self._num_records > MAX_PERF_KEPT:    # records nobody will ask for (failed requests, others')
                oldest = next(iter(self._records))
                self._take(oldest)

    def _headers(self, request_type: str, prompt_ids: list[int]) -> dict[str, str]:
        if self.key is None:
            return {}
        return {AUTH_HEADER: orchestrator_token(self.key, request_type, np.array([prompt_ids], np.int32), time.time())}

    def _fail(self, message: str, kind: str, transport: bool = False) -> RoleError:
        return RoleError(f"instance {self.name}: {message}", kind, self.name, transport=transport)

    async def stream(self, request_id: str, request_type: str, prompt_ids: list[int], sampling: SamplingInputs,
                     handle: bytes | None = None) -> AsyncIterator[RoleChunk]:
        if sampling.triton_inputs:
            raise self._fail("trtllm-serve takes OpenAI fields, not Triton tensors "
                             f"({', '.join(sorted(sampling.triton_inputs))})", "invalid_arg")
        if sampling.return_generation_logits:
            raise self._fail("trtllm-serve's OpenAI API does not return generation logits", "invalid_arg")
        if request_type == CONTEXT_ONLY:
            chunk = await self._context(prompt_ids, sampling)
            if chunk.handle is not None:
                self._await_perf(request_id, read_handle(chunk.handle, self.name)[0].ctx_request_id, CONTEXT_ONLY)
            yield chunk
            return
        params = None
        if request_type == GENERATION_ONLY:
            if handle is None:
                raise self._fail("generation_only needs the context answer", "internal")
            params = read_handle(handle, self.name)[0].for_generation()
            self._await_perf(request_id, params.ctx_request_id, GENERATION_ONLY)
        body = request_body(self.model, prompt_ids, sampling, True, params)
        async for chunk in self._streamed(body, request_type, prompt_ids):
            yield chunk
        self._finished(request_id)

    async def _context(self, prompt_ids: list[int], sampling: SamplingInputs) -> RoleChunk:
        body = request_body(self.model, prompt_ids, sampling, False, DisaggregatedParams(CONTEXT_ONLY))
        try:
            r = await self.client.post("/v1/completions", json=body, headers=self._headers(CONTEXT_ONLY, prompt_ids))
        except httpx.HTTPError as exc:
            raise self._fail(f"cannot be reached ({type(exc).__name__}: {exc})", "unavailable", True) from None
        self._check(r.status_code, r.content)
        try:
            choices = r.json()["choices"]
            choice = choices[0]
            if len(choices) != 1 or not isinstance(choice.get("disaggregated_params"), dict):
                raise ValueError("not one choice with disaggregated_params")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise self._fail(f"the context answer is not trtllm-serve's ({exc})", "internal") from None
        if choice.get("finish_reason") not in GO_ON_TO_GENERATION:
            return ended_chunk(choice, sampling.end_id)
        if choice["disaggregated_params"].get("ctx_request_id") is None:   # upstream's _verify_ctx_response
            raise self._fail("the context answer has no ctx_request_id", "internal")
        tokens = [int(t) for t in choice["disaggregated_params"].get("first_gen_tokens") or []]
        return RoleChunk(tokens, handle=context_handle(choice), final=True)

    async def _streamed(self, body: dict, request_type: str, prompt_ids: list[int]) -> AsyncIterator[RoleChunk]:
        complete = False
        try:
            async with self.client.stream("POST", "/v1/completions", json=body,
                                          headers=self._headers(request_type, prompt_ids)) as r:
                if r.status_code != 200:
                    self._check(r.status_code, await r.aread())
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = self._chunk(data)
                    if chunk is None:
                        continue
                    complete = complete or chunk.final
                    yield chunk
        except httpx.HTTPError as exc:
            raise self._fail(f"the stream broke ({type(exc).__name__}: {exc})", "unavailable", True) from None
        if not complete:
            raise self._fail("the stream ended before the request finished", "unavailable", True)

    def _chunk(self, data: str) -> RoleChunk | None:
        try:
            message = json.loads(data)
        except ValueError:
            raise self._fail(f"not a server-sent event of trtllm-serve: {data[:100]!r}", "internal") from None
        if message.get("object") == "error":
            raise self._fail(str(message.get("message")), "internal")
        choices = message.get("choices") or []
        if not choices:            # the usage chunk
            return None
        choice = choices[0]
        return RoleChunk([int(t) for t in choice.get("token_ids") or []],
                         final=choice.get("finish_reason") is not None)

    def _check(self, status: int, content: bytes) -> None:
        if status == 200:
            return
        message = error_message(status, content)
        kind = "unavailable" if status >= 500 or status in (404, 408, 429) else "internal"
        raise self._fail(f"HTTP {status}: {message}", kind)

    async def probe(self, role: str) -> InstanceView:
        """The worker's load from `/metrics`: the iteration stats since the last read, the latest of which counts.
        trtllm-serve records stats only for iterations it runs, so
        - a worker that has run none yet is empty: it is reported with unbounded free KV (its size is not known
          until its first stats), which makes a newly started worker the first choice rather than never chosen;
        - no iteration since the last read: nothing is queued or running there (a waiting request makes it
          iterate); a generation worker's KV is all free again, a context worker's holds what it exported.
        No answer: unhealthy."""
        try:
            r = await self.client.get("/metrics", timeout=METRICS_TIMEOUT_S)
            stats = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            stats = None
        if not isinstance(stats, list):
            return InstanceView(name=self.name, role=role, state="unhealthy")
        if stats and isinstance(stats[-1], dict):
            self._view = view_from_stats(self.name, role, stats[-1])
            return self._view
        if self._view is None:
            return InstanceView(name=self.name, role=role, free_kv_blocks=UNKNOWN_FREE_BLOCKS)
        idle = dataclasses.replace(self._view, waiting=0)
        if role != "prefill":
            idle = dataclasses.replace(idle, active=0, free_kv_blocks=idle.max_kv_blocks)
        return idle
