"""The twin worker's HTTP API, in trtllm-serve's shapes (tensorrt_llm/serve/openai_server.py, TensorRT-LLM 1.2.1).

Routes: /health (200, empty), /version, /v1/models, /metrics (the iteration stats since the last read, a JSON list,
and only with `enable_iter_perf_stats: true`, as upstream), /perf_metrics (a record per finished request since the
last read, only with `return_perf_metrics: true` and `perf_metrics_max_requests` > 0), GET/POST /steady_clock_offset (upstream's router
calls both on every worker it adds), and /v1/completions, whose `disaggregated_params` pick the phase:
- context_only: prefill; the answer (not streamed) carries `prompt_token_ids` and, on its one choice,
  `disaggregated_params` {request_type, first_gen_tokens, ctx_request_id, encoded_opaque_state, draft_tokens},
  finish_reason "not_finished" ("length" when max_tokens is 1). The KV stays exported until a generation worker
  pulls it, the export is given up, or kv_transfer_timeout_ms passes. A first token that ended the request (its
  end id, a stop token) gives finish_reason "stop", disaggregated_params {request_type: context_only} and the rest
  null, and no KV is kept;
- generation_only: pulls the KV named by encoded_opaque_state (trtpd's signed handle) and generates; its output
  starts with the first token again (first_gen_tokens), as a generation server's does;
- none: both phases here (a worker without --server_role).
`detokenize: false` puts `token_ids` on each choice instead of text (what trtpd's gateway asks for).
Every failure of a request is a 400 ErrorResponse, flat (`create_error_response`); a client that goes away
aborts its request, which frees its KV at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtpd.detokenize import text_delta
from trtpd.engine.request import EngineOutput, EngineRequest, RequestError, RequestType
from trtpd.engine.sampler import SamplingParams
from trtpd.schema.trtllm_serve import (AUTH_HEADER, CONTEXT_ONLY, GENERATION_ONLY, DisaggregatedParams,
                                       ProtocolError, RequestTimings, encode_opaque_state, error_body, perf_record)
from trtpd.serve_twin.engine_bridge import AsyncEngine

log = logging.getLogger(__name__)
TRTLLM_VERSION = "1.2.1"             # the release this twin mimics
DEFAULT_MAX_TOKENS = 32              # tensorrt_llm SamplingParams.max_tokens's default
MAX_ITER_STATS = 1000                # iteration stats kept between two reads of /metrics


class ServeCompletionRequest(BaseModel):
    """openai_protocol.py CompletionRequest: its fields, unknown ones refused (OpenAIBaseModel extra="forbid").
    The twin serves what the reference engine can; a field it cannot honour is refused by name when set."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: list[int] | list[list[int]] | str | list[str]
    best_of: int | None = None
    echo: bool | None = False
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = None
    n: int = 1
    presence_penalty: float | None = 0.0
    seed: int | None = None
    stop: str | list[str] | None = Field(default_factory=list)
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    lora_request: dict[str, Any] | None = None
    use_beam_search: bool = False
    top_k: int = 0
    top_p_min: float = 0.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    length_penalty: float = 1.0
    early_stopping: bool = False
    stop_token_ids: list[int] | None = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    return_context_logits: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    response_format: dict[str, Any] | None = None
    disaggregated_params: dict[str, Any] | None = None


# fields the reference engine cannot honour: refused when set to anything but upstream's default
_UNSERVED = {"best_of": None, "echo": False, "frequency_penalty": 0.0, "logit_bias": None, "logprobs": None, "n": 1,
             "presence_penalty": 0.0, "suffix": None, "lora_request": None, "use_beam_search": False,
             "top_p_min": 0.0, "min_p": 0.0, "repetition_penalty": 1.0, "length_penalty": 1.0,
             "early_stopping": False, "truncate_prompt_tokens": None, "return_context_logits": False,
             "response_format": None}


class TwinError(Exception):
    """A request the twin answers with an ErrorResponse (400 unless `status` says otherwise)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class _Times:
    """What a request's /perf_metrics record needs, gathered as its outputs pass (steady clock, seconds)."""

    def __init__(self, arrival_s: float) -> None:
        self.arrival_s = arrival_s
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.first_iter = self.last_iter = -1
        self.perf: dict[str, float] = {}

    def saw(self, out: EngineOutput, now_s: float, step: int) -> None:
        self.perf.update(out.perf)
        if out.new_token_ids or out.finished:
            if self.first_token_s is None:
                self.first_token_s, self.first_iter = now_s, step
            self.last_token_s, self.last_iter = now_s, step

    def timings(self) -> RequestTimings:
        """The engine's phases on this request's clock: a context request queued, then computed until its token;
        a generation request queued until its KV pull started, pulled (the pull's whole wall time), then
        generated."""
        first = self.first_token_s if self.first_token_s is not None else self.arrival_s
        last = self.last_token_s if self.last_token_s is not None else first
        p = self.perf
        if "kv_transfer_s" in p:
            start = self.arrival_s + p.get("decode_queue_s", 0.0)
            end = min(first, start + p["kv_transfer_s"] + p.get("prefill_compute_s", 0.0))
            return RequestTimings(self.arrival_s, start, first, last, int(p.get("kv_bytes", 0)), start, end)
        scheduled = min(first, self.arrival_s + p.get("prefill_queue_s", p.get("decode_queue_s", 0.0)))
        return RequestTimings(self.arrival_s, scheduled, first, last)


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse(error_body(message, status), status_code=status)


class TwinWorker:
    """One worker: its engine, tokenizer, stats and the deployment key (None: requests are not authenticated)."""

    def __init__(self, engine: AsyncEngine, model_name: str, role: str, key: bytes | None,
                 iter_stats: bool = False, perf_metrics_max_requests: int = 0) -> None:
        self.engine = engine
        self.tokenizer = engine.loaded.tokenizer
        self.model_name = model_name
        self.role = role
        self.key = key
        self.iter_stats = iter_stats
        self.stats: deque[dict] = deque(maxlen=MAX_ITER_STATS)
        # return_perf_metrics with perf_metrics_max_requests > 0: the newest records, else none (upstream's deque)
        self.perf_max = perf_metrics_max_requests
        self.perf_records: deque[dict] | None = deque(maxlen=self.perf_max) if self.perf_max > 0 else None
        self._perf_ids = itertools.count(1)
        self._ids = itertools.count(1)       # ctx_request_id: the executor's request ids are integers
        self._last_step = -1
        self.clock_offset_s = 0.0

    # ---- requests -----------------------------------------------------------------------------------
    def engine_request(self, req: ServeCompletionRequest, headers) -> tuple[EngineRequest, DisaggregatedParams | None]:
        for name, default in _UNSERVED.items():
            if getattr(req, name) != default:
                raise TwinError(f"{name}: not supported by the trtllm-serve twin (the reference engine); send "
                                f"{default!r} or leave it out")
        if req.stop:
            raise TwinError("stop: stop strings are not supported by the trtllm-serve twin; use stop_token_ids")
        if req.stream_options and not req.stream:
            raise TwinError("Stream options can only be defined when stream is true.")
        disagg = None
        if req.disaggregated_params is not None:
            try:
                disagg = DisaggregatedParams.from_dict(req.disaggregated_params)
            except ProtocolError as exc:
                raise TwinError(str(exc)) from None
        request_type = {None: RequestType.CONTEXT_AND_GENERATION, CONTEXT_ONLY: RequestType.CONTEXT_ONLY,
                        GENERATION_ONLY: RequestType.GENERATION_ONLY}.get(
            disagg.request_type if disagg else None, RequestType.CONTEXT_AND_GENERATION)
        ids = self._prompt_ids(req)
        if self.key is not None:
            from trtpd.kv.auth import check_orchestrator_token
            import numpy as np
            try:
                check_orchestrator_token(self.key, headers.get(AUTH_HEADER),
                                         "" if disagg is None or request_type is RequestType.CONTEXT_AND_GENERATION
                                         else disagg.request_type, np.array([ids], np.int32), time.time(),
                                         f"trtllm-serve twin ({self.role})")
            except ValueError as exc:
                raise TwinError(str(exc), 403) from None
        handle = None
        if request_type is RequestType.GENERATION_ONLY:
            if not disagg.encoded_opaque_state or disagg.ctx_request_id is None or not disagg.first_gen_tokens:
                raise TwinError("disaggregated_params: a generation_only request needs the context server's "
                                "first_gen_tokens, ctx_request_id and encoded_opaque_state")
            try:
                handle = disagg.opaque_state()
            except ProtocolError as exc:
                raise TwinError(str(exc)) from None
        eos = None if req.ignore_eos else self.tokenizer.eos_id
        try:
            sampling = SamplingParams(temperature=1.0 if req.temperature is None else req.temperature,
                                      top_k=req.top_k, top_p=1.0 if req.top_p is None else req.top_p,
                                      seed=req.seed or 0)
        except ValueError as exc:
            raise TwinError(str(exc)) from None
        rid = f"twin-{uuid.uuid4().hex[:12]}"
        return EngineRequest(rid, ids, DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens,
                             request_type, sampling, eos, True, handle, time.monotonic(),
                             stop_words=[[t] for t in (req.stop_token_ids or [])], min_tokens=req.min_tokens), disagg

    def _prompt_ids(self, req: ServeCompletionRequest) -> list[int]:
        prompt = req.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_bos=req.add_special_tokens)
        if prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise TwinError("prompt: the trtllm-serve twin serves one prompt per request (a string or a list of "
                        "token ids)")

    async def complete(self, req: ServeCompletionRequest, request: Request):
        engine_req, disagg = self.engine_request(req, request.headers)
        try:
            self.engine.validate(engine_req)
        except Exception as exc:     # RequestError, a forged/expired handle, a layout mismatch: all 400 upstream
            raise TwinError(str(exc)) from None
        times = _Times(engine_req.arrival_s)
        outputs = self._timed(self.engine.generate(engine_req), times)
        if engine_req.request_type is RequestType.CONTEXT_ONLY or not req.stream:
            return await self._whole(req, engine_req, disagg, outputs, request, times)
        return await self._streamed(req, engine_req, disagg, outputs, request, times)

    async def _timed(self, outputs: AsyncIterator[EngineOutput], times: _Times) -> AsyncIterator[EngineOutput]:
        try:
            async for out in outputs:
                times.saw(out, time.monotonic(), self.engine.engine_loop.num_steps)
                yield out
        finally:
            await outputs.aclose()     # closing this aborts the request in the engine, as closing `outputs` does

    def add_perf(self, engine_req: EngineRequest, ctx_request_id: int | None, times: _Times,
                 answered_s: float) -> None:
        """A finished request's /perf_metrics record (openai_server.py _extract_metrics: only with
        return_perf_metrics and perf_metrics_max_requests > 0)."""
        if self.perf_records is None:
            return
        blocks = self.engine.loaded.config.tokens_per_block
        num_blocks = -(-len(engine_req.prompt_token_ids) // blocks) if blocks else 0
        self.perf_records.append(perf_record(
            next(self._perf_ids), ctx_request_id, times.timings(), max(0, times.first_iter), max(0, times.last_iter),
            0.0, engine_req.arrival_s, answered_s, num_blocks))

    def drain_perf(self) -> list[dict]:
        """GET /perf_metrics: every record since the last read, the router's clock offset added, then none."""
        if self.perf_records is None:
            return []
        out = list(self.perf_records)
        self.perf_records.clear()
        for record in out:
            timing = record["perf_metrics"]["timing_metrics"]
            for key, value in timing.items():
                if isinstance(value, float):
                    timing[key] = value + self.clock_offset_s
        return out

    async def _collect(self, outputs, request: Request, request_id: str) -> tuple[list[int], EngineOutput | None,
                                                                               bytes | None]:
        """The whole answer. The client is checked every second and its request aborted when it went away, as
        upstream's await_disconnected does (openai_server.py)."""
        async def collect():
            tokens, last, handle = [], None, None
            async for out in outputs:
                if out.error is not None:
                    raise TwinError(f"request {request_id}: {out.error}")
                tokens += out.new_token_ids
                handle = out.context_phase_params or handle
                last = out
            return tokens, last, handle

        task = asyncio.ensure_future(collect())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=1.0)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    log.info("the client is disconnected, abort %s", request_id)
                    task.cancel()      # the engine bridge aborts the request: its KV is freed
                    raise TwinError(f"request {request_id}: the client is disconnected", 499)
        finally:
            if not task.done():
                task.cancel()

    async def _whole(self, req: ServeCompletionRequest, engine_req: EngineRequest, disagg: DisaggregatedParams | None,
                     outputs, request: Request, times: _Times):
        tokens, last, handle = await self._collect(outputs, request, engine_req.request_id)
        if last is None or last.finish_reason == "cancelled":
            raise TwinError(f"request {engine_req.request_id} was aborted")
        choice: dict[str, Any] = {"index": 0, **self._text(req, [], tokens, True), "logprobs": None,
                                  "context_logits": None, "finish_reason": None, "stop_reason": None,
                                  "disaggregated_params": None, "avg_decoded_tokens_per_iter": None}
        body: dict[str, Any] = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                                "created": int(time.time()), "model": self.model_name, "choices": [choice],
                                "usage": self._usage(engine_req, len(tokens)), "prompt_token_ids": None}
        ctx_request_id = disagg.ctx_request_id if disagg is not None else None
        if engine_req.request_type is RequestType.CONTEXT_ONLY and handle is None:
            # the first token ended the request (its end id, a stop word): the PyTorch executor finished it (END_ID,
            # STOP_WORDS) and sent no KV (py_executor _send_disagg_ctx_cache: only a request whose context finished
            # without ending it, or one finished by its length), and executor/result.py answers with the request's
            # own disaggregated_params: context_only, no ctx_request_id, first tokens or opaque state
            choice["finish_reason"] = last.finish_reason
            choice["disaggregated_params"] = DisaggregatedParams(CONTEXT_ONLY).to_dict()
            body["prompt_token_ids"] = engine_req.prompt_token_ids
        elif engine_req.request_type is RequestType.CONTEXT_ONLY:
            # the context phase done, the request goes on at a generation server (a "length" answer too: _need_gen)
            ctx_request_id = next(self._ids)
            choice["finish_reason"] = last.finish_reason or "not_finished"
            choice["disaggregated_params"] = DisaggregatedParams(
                CONTEXT_ONLY, list(tokens), ctx_request_id, encode_opaque_state(handle), None).to_dict()
            body["prompt_token_ids"] = engine_req.prompt_token_ids
        else:
            choice["finish_reason"] = last.finish_reason
        self.add_perf(engine_req, ctx_request_id, times, time.monotonic())   # before the answer, as upstream
        return JSONResponse(body)

    async def _streamed(self, req: ServeCompletionRequest, engine_req: EngineRequest,
                        disagg: DisaggregatedParams | None, outputs, request: Request, times: _Times):
        # the first output decides the status: a KV pull or validation that fails is a 400, not a broken stream
        first = await anext(outputs)
        if first.error is not None:
            await outputs.aclose()
            raise TwinError(f"request {engine_req.request_id}: {first.error}")
        response_id = f"cmpl-{uuid.uuid4().hex}"
        include_usage = bool((req.stream_options or {}).get("include_usage", True)) if req.stream_options else False

        async def body() -> AsyncIterator[bytes]:
            sent: list[int] = []
            out: EngineOutput | None = first
            first_sent_s = None
            try:
                while out is not None:
                    if out.error is not None:
                        yield _sse(error_body(f"request {engine_req.request_id}: {out.error}"))
                        return
                    if out.new_token_ids or out.finished:
                        chunk = {"index": 0, **self._text(req, sent, out.new_token_ids, out.finished),
                                 "logprobs": None, "finish_reason": out.finish_reason if out.finished else None,
                                 "stop_reason": None, "avg_decoded_tokens_per_iter": None}
                        sent += out.new_token_ids
                        first_sent_s = first_sent_s or time.monotonic()
                        yield _sse({"id": response_id, "object": "text_completion", "created": int(time.time()),
                                    "model": self.model_name, "choices": [chunk], "usage": None})
                    if out.finished:
                        break
                    out = await anext(outputs, None)
                if include_usage:
                    yield _sse({"id": response_id, "object": "text_completion", "created": int(time.time()),
                                "model": self.model_name, "choices": [],
                                "usage": self._usage(engine_req, len(sent))})
                yield b"data: [DONE]\n\n"
                # after [DONE] and before the body ends, as upstream's generator does
                self.add_perf(engine_req, disagg.ctx_request_id if disagg is not None else None, times,
                              first_sent_s or time.monotonic())
            finally:
                await outputs.aclose()     # a client gone mid-stream: the engine aborts the request

        return StreamingResponse(body(), media_type="text/event-stream")

    def _text(self, req: ServeCompletionRequest, prefix: list[int], new: list[int], final: bool) -> dict:
        if not req.detokenize:
            return {"text": "", "token_ids": list(new)}
        return {"text": text_delta(self.tokenizer, prefix, new, is_final=final), "token_ids": None}

    @staticmethod
    def _usage(engine_req: EngineRequest, completion_tokens: int) -> dict:
        prompt = len(engine_req.prompt_token_ids)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion_tokens,
                "completion_tokens": completion_tokens, "prompt_tokens_details": None}

    # ---- stats ----------------------------------------------------------------------------------------
    def record_iteration(self) -> None:
        """One iteration-stats entry per engine step that produced output (the engine thread calls it)."""
        loop = self.engine.engine_loop
        if not self.iter_stats or loop.num_steps == self._last_step:
            return
        self._last_step = loop.num_steps
        s = self.engine.stats()
        self.stats.append({
            "iter": loop.num_steps, "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
            "numActiveRequests": int(s.get("active", 0)), "numQueuedRequests": int(s.get("waiting", 0)),
            "numCompletedRequests": int(s.get("completed", 0)),
            "maxNumActiveRequests": self.engine.loaded.config.max_batch_size,
            "maxBatchSizeStatic": self.engine.loaded.config.max_batch_size,
            "maxNumTokensStatic": self.engine.loaded.config.max_num_tokens,
            "kvCacheStats": {"maxNumBlocks": int(s.get("max_blocks", 0)), "freeNumBlocks": int(s.get("free_blocks", 0)),
                             "usedNumBlocks": int(s.get("used_blocks", 0)),
                             "tokensPerBlock": int(s.get("tokens_per_block", 0)),
                             "allocTotalBlocks": int(s.get("used_blocks", 0))},
            "inflightBatchingStats": {"numPausedRequests": 0}})

    def drain_stats(self) -> list[dict]:
        out = list(self.stats)
        self.stats.clear()
        return out


def _sse(data: dict) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def create_app(worker: TwinWorker) -> FastAPI:
    app = FastAPI(title="trtllm-serve twin (trtpd)")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        return _error(str(exc))

    @app.exception_handler(TwinError)
    async def _twin(_: Request, exc: TwinError):
        return _error(str(exc), exc.status)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": TRTLLM_VERSION}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": worker.model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "tensorrt_llm"}]}

    @app.get("/metrics")
    async def metrics():
        return JSONResponse(worker.drain_stats())

    @app.get("/perf_metrics")
    async def perf_metrics():
        return JSONResponse(worker.drain_perf())

    @app.get("/steady_clock_offset")
    async def steady_clock_offset():
        receive_ts = time.monotonic()
        await asyncio.sleep(0.2)
        return {"receive_ts": receive_ts, "transmit_ts": time.monotonic()}

    @app.post("/steady_clock_offset")
    async def set_steady_clock_offset(offset: float = Body(..., embed=True)):
        worker.clock_offset_s = offset
        return Response(status_code=200)

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            req = ServeCompletionRequest.model_validate(await request.json())
        except ValidationError as exc:
            return _error(str(exc))
        except ValueError as exc:
            return _error(f"the request body is not JSON: {exc}")
        try:
            return await worker.complete(req, request)
        except RequestError as exc:
            return _error(str(exc))

    return app
