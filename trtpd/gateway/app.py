"""The gateway's HTTP surface (FastAPI): OpenAI's /v1/completions, /v1/chat/completions and /v1/models,
plus /health and /metrics.

Errors are OpenAI error bodies: 400 for a malformed or invalid request (the field named), 401 for a
missing or wrong API key, 404 for an unknown model, 413 for a body over the limit, 429 when the queue
is full; 500 and 503 only for the server's own faults. A client that goes away cancels its request on
the instances, which free its KV at once.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from pydantic import ValidationError

from trtpd.gateway.config import GatewayConfig
from trtpd.gateway.detok import IncrementalDetokenizer
from trtpd.gateway.orchestrator import FleetOrchestrator, GatewayError
from trtpd.gateway.responses import DONE, ResponseShape, sse
from trtpd.gateway.role_client import SamplingInputs
from trtpd.gateway.schemas import ChatCompletionRequest, CompletionRequest, chat_prompt, error_body
from trtpd.gateway.service import FleetService
from trtpd.gateway.timing import RequestTiming

log = logging.getLogger(__name__)
STATUS = {"invalid_arg": 400, "unauthorized": 401, "not_found": 404, "too_large": 413, "overloaded": 429,
          "internal": 500, "unavailable": 503}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
               413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class ApiError(Exception):
    def __init__(self, message: str, kind: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = STATUS[kind]
        self.param = param
        self.code = code


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(str(exc), ERROR_TYPES[exc.status], exc.param, exc.code), status_code=exc.status)


def create_app(config: GatewayConfig, service: FleetService | None = None) -> FastAPI:
    service = service or FleetService(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="trtpd gateway", lifespan=lifespan)
    app.state.service = service
    metrics = service.metrics

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        metrics.requests.labels(request.url.path, str(exc.status)).inc()
        return _error(exc)

    def _refusal(scope) -> ApiError | None:
        """A body over the limit, or a /v1/ request without a valid API key."""
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > config.max_body_bytes:
            return ApiError(f"request body of {length} bytes is over the limit of {config.max_body_bytes}", "too_large")
        if config.api_keys and scope["path"].startswith("/v1/"):
            given = headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not any(hmac.compare_digest(given, k) for k in config.api_keys):
                return ApiError("missing or wrong API key: send `Authorization: Bearer <key>`", "unauthorized",
                                code="invalid_api_key")
        return None

    class _Limits:
        """_refusal's check before routing, as plain ASGI (starlette's BaseHTTPMiddleware runs every request,
        and every streamed chunk, through a task group and a memory stream)."""

        def __init__(self, app) -> None:
            self.app = app

        async def __call__(self, scope, receive, send) -> None:
            refused = _refusal(scope) if scope["type"] == "http" else None
            if refused is None:
                await self.app(scope, receive, send)
            else:
                await _error(refused)(scope, receive, send)

    app.add_middleware(_Limits)

    def _admin(request: Request) -> None:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given, service.admin_token):
            raise ApiError("missing or wrong admin token", "unauthorized", code="invalid_admin_token")

    @app.post("/admin/reload")
    async def reload(request: Request):
        """Re-reads fleet.json now (the controller calls it after every change) and probes the instances."""
        _admin(request)
        service.reload(force=True)
        await service.poll_once()
        return service.health()

    @app.get("/admin/requests")
    async def recent_requests(request: Request, since: float = 0.0):
        """Finished requests since `since` (unix time): revision, TTFT, ITL, error kind (the rollout gate)."""
        _admin(request)
        return {"now": time.time(), "requests": service.samples_since(since)}

    @app.put("/admin/instances/{name}")
    async def instance_state(name: str, request: Request):
        """{"state": "draining" | "ready"}; needs `Authorization: Bearer <admin token>` (FleetService.admin_token)."""
        _admin(request)
        try:
            state = json.loads(await request.body()).get("state")
        except (json.JSONDecodeError, AttributeError):
            raise ApiError('the body must be {"state": "draining" | "ready"}', "invalid_arg", "state") from None
        return service.set_instance_state(name, state)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "created": 0,
                                            "owned_by": "trtpd"}]}

    @app.get("/health")
    async def health():
        body = service.health()
        return JSONResponse(body, status_code=200 if body["status"] != "unavailable" else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request):
        body = await _parse(request, CompletionRequest)
        return await _serve(request, "completions", body, body.prompt, body.max_tokens or config.default_max_tokens)

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat(request: Request):
        body = await _parse(request, ChatCompletionRequest)
        return await _serve(request, "chat", body, chat_prompt(body.messages), body.max_new_tokens)

    async def _serve(request: Request, endpoint: str, body, prompt: str, max_new_tokens: int | None):
        if body.model != config.model_name:
            raise ApiError(f"model {body.model!r} does not exist; this server serves {config.model_name!r}",
                           "not_found", "model", "model_not_found")
        prompt_ids = service.tokenizer.encode(prompt)
        max_new = _max_new_tokens(config, endpoint, len(prompt_ids), max_new_tokens)
        sampling = SamplingInputs(max_new_tokens=max_new, temperature=body.temperature, top_p=body.top_p,
                                  seed=body.seed if body.seed is not None else secrets.randbits(63),
                                  end_id=-1 if body.ignore_eos else config.eos_id)   # -1: no end id
        request_id = secrets.token_hex(8)
        shape = ResponseShape(endpoint, request_id, config.model_name)
        ticket = service.ticket()   # ApiError(429) when the queue is full; the wait itself is part of TTFT
        stream = _Generation(service, ticket, request_id, prompt_ids, sampling, body.stop_strings)
        if body.stream:
            return StreamingResponse(_sse(stream, shape, body.include_usage, request.url.path),
                                     media_type="text/event-stream")
        try:
            text, reason = await _whole(request, stream)
        except GatewayError as exc:
            raise ApiError(str(exc), exc.kind) from None
        except ApiError:
            raise
        except Exception as exc:
            log.exception("request %s failed", shape.id)
            raise ApiError(f"internal error: {type(exc).__name__}: {exc}", "internal") from None
        metrics.requests.labels(request.url.path, "200").inc()
        # JSON-native already: a response as it is (FastAPI would walk the dict through jsonable_encoder)
        return JSONResponse(shape.whole(text, reason, len(prompt_ids), stream.num_tokens))

    async def _sse(stream: "_Generation", shape: ResponseShape, include_usage: bool, path: str):
        first = True
        try:
            async for text in stream.texts():
                if text:
                    yield shape.chunk(text, first=first)
                    first = False
            yield shape.chunk("", finish_reason=stream.finish_reason, first=first)
            if include_usage:
                yield shape.usage_chunk(len(stream.prompt_ids), stream.num_tokens)
            metrics.requests.labels(path, "200").inc()
        except GatewayError as exc:
            status = STATUS.get(exc.kind, 500)
            metrics.requests.labels(path, str(status)).inc()
            yield sse(error_body(str(exc), ERROR_TYPES[status]))
        except Exception as exc:   # never a silently truncated stream: the client hears that it failed
            log.exception("request %s failed", shape.id)
            metrics.requests.labels(path, "500").inc()
            yield sse(error_body(f"internal error: {type(exc).__name__}: {exc}", ERROR_TYPES[500]))
        yield DONE

    return app


def _body_schema(model) -> dict:
    """The request body in the OpenAPI document, self-contained (the handlers parse it themselves, to answer
    OpenAI errors rather than FastAPI's 422)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _inline(schema, defs)}}}}


def _inline(schema, defs):
    """Replaces local $refs by their definitions."""
    if isinstance(schema, dict):
        ref = schema.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return _inline(defs[ref.rsplit("/", 1)[1]], defs)
        return {k: _inline(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


async def _parse(request: Request, model):
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}", "invalid_arg") from None
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object", "invalid_arg")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        message = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        raise ApiError(message, "invalid_arg", field) from None


def _max_new_tokens(config: GatewayConfig, endpoint: str, num_prompt_tokens: int, asked: int | None) -> int:
    if num_prompt_tokens > config.max_input_len:
        raise ApiError(f"the prompt has {num_prompt_tokens} tokens, over this model's limit of "
                       f"{config.max_input_len}; shorten it", "invalid_arg", "prompt", "context_length_exceeded")
    room = config.max_seq_len - num_prompt_tokens
    if asked is None:
        asked = min(room, config.chat_max_tokens_cap) if endpoint == "chat" else min(room, config.default_max_tokens)
    if asked > room:
        raise ApiError(f"max_tokens {asked} plus the prompt's {num_prompt_tokens} tokens exceeds the context "
                       f"length {config.max_seq_len}; ask for at most {room}", "invalid_arg", "max_tokens",
                       "context_length_exceeded")
    return asked


async def _whole(request: Request, stream: "_Generation") -> tuple[str, str]:
    """Runs a non-streaming request to its end; cancels it if the client disconnects meanwhile."""
    task = asyncio.ensure_future(stream.collect())
    while not task.done():
        done, _ = await asyncio.wait({task}, timeout=0.1)
        if not done and await request.is_disconnected():
            task.cancel()
            raise ApiError("the client disconnected", "invalid_arg")
    return task.result()


class _Generation:
    """One request's generation: tokens from the fleet turned into stable text, timed and measured."""

    def __init__(self, service: FleetService, ticket, request_id: str, prompt_ids: list[int],
                 sampling: SamplingInputs, stop: list[str]) -> None:
        self.service = service
        self.ticket = ticket
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.detok = IncrementalDetokenizer(service.tokenizer, stop)
        self.timing = RequestTiming(time.monotonic())
        self.num_tokens = 0
        self.finish_reason = "length"
        self.perf: dict[str, float] = {}

    async def texts(self):
        """The stable text of each step; releases the admission slot and records metrics however it ends."""
        orchestrator: FleetOrchestrator = self.service.orchestrator
        error_kind, where, cohort, generation = "cancelled", ("", ""), None, None
        try:
            await self.ticket.enter()
            cohort = self.service.cohort()   # once admitted: the split as it is when the request starts
            generation = orchestrator.generate(self.request_id, self.prompt_ids, self.sampling, cohort)
            async for out in generation:
                where = (out.prefill_instance or "", out.decode_instance or "")
                if out.token_ids:
                    self.timing.add_tokens(len(out.token_ids), time.monotonic())
                self.perf.update(out.perf)
                text = self._take(out.token_ids)
                yield text
                if self.detok.stopped or self.finish_reason == "stop":
                    break
            yield self.detok.finish()
            if self.detok.stopped:
                self.finish_reason = "stop"
            error_kind = None
            self.service.record(self.timing, self.perf)
        except GatewayError as exc:
            error_kind = exc.kind
            raise
        except Exception:
            error_kind = "internal"
            raise
        finally:
            # the revision that served it (a request the split handed to the other cohort counts there)
            self.service.sample(self.timing, cohort.revision if cohort else 0, error_kind, where,
                                len(self.prompt_ids), self.perf)
            if generation is not None:   # cancels the instance's stream if we stop early (stop string, disconnect)
                await generation.aclose()
            self.ticket.release()

    def _take(self, token_ids: list[int]) -> str:
        ids = []
        for token in token_ids:
            self.num_tokens += 1
            if token == self.sampling.end_id:
                self.finish_reason = "stop"
                break
            ids.append(token)
        return self.detok.add(ids)

    async def collect(self) -> tuple[str, str]:
        async for _ in self.texts():
            pass
        return self.detok.text, self.finish_reason


__all__ = ["create_app", "ApiError"]
