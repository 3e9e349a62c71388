"""The gateway's HTTP surface (FastAPI): OpenAI's /v1/completions, /v1/chat/completions and /v1/models,
plus /health and /metrics.

Errors are OpenAI error bodies: 400 for a malformed or invalid request (the field named), 401 for a
missing or wrong API key, 404 for an unknown model, 413 for a body over the limit (however it is sent),
429 when the queue is full (with Retry-After); 500 and 503 only for the server's own faults. Every answer
to /v1/ and /admin/ is counted in trtpd_gateway_requests_total by its status, a stream by how it ended
(499: the client went away or stopped reading). A streamed response starts (200) only with its first
token, so a request that fails before it (no instance ready, prefill failed) gets its real status. A
client that goes away, or stops reading for longer than its buffer holds, cancels its request on the
instances, which free its KV at once.

Access (`GatewayConfig.api_keys`): with keys configured, /v1/*, /metrics and the API documents (/docs,
/redoc, /openapi.json) need `Authorization: Bearer <key>`; /health stays open (liveness and readiness
probes); /admin/* needs the fleet's admin token. Without keys (`--no-auth`, loopback only) all is open.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import time
from collections import deque
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import Headers

from trtpd.engine.tokenizer import InvalidTextError
from trtpd.admission import Overloaded
from trtpd.gateway.config import GatewayConfig
from trtpd.gateway.detok import IncrementalDetokenizer
from trtpd.orchestration.orchestrator import OrchestratorError
from trtpd.gateway.responses import DONE, ResponseShape, sse
from trtpd.orchestration.transport import SamplingInputs
from trtpd.gateway.schemas import (ChatCompletionRequest, CompletionRequest, TokenGenerateRequest, chat_prompt,
                                   error_body)
from trtpd.gateway.service import FleetService, ServedRequest

log = logging.getLogger(__name__)
STATUS = {"invalid_arg": 400, "unauthorized": 401, "not_found": 404, "too_large": 413, "overloaded": 429,
          "internal": 500, "unavailable": 503}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
               413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
CLIENT_GONE = 499                 # nginx's "client closed request": the client left or stopped reading
INLINE_TOKENIZE_CHARS = 4096      # longer prompts are tokenized on a worker thread, off the event loop
PROTECTED = ("/v1/", "/metrics", "/docs", "/redoc", "/openapi.json")
ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/admin/generate")


class ApiError(Exception):
    def __init__(self, message: str, kind: str, param: str | None = None, code: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = STATUS[kind]
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s


def _error(exc: ApiError, close: bool = False) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else {}
    if close:
        headers["Connection"] = "close"
    return JSONResponse(error_body(str(exc), ERROR_TYPES[exc.status], exc.param, exc.code), status_code=exc.status,
                        headers=headers)


class _BodyTooLarge(Exception):
    pass


def _endpoint(path: str) -> str | None:
    """The `endpoint` label of a counted request (a fixed set: a client cannot mint label values)."""
    if path in ENDPOINTS:
        return path
    if path.startswith("/v1/"):
        return "/v1/other"
    return "/admin" if path.startswith("/admin/") else None


class _Guard:
    """Plain ASGI in front of the routes (starlette's BaseHTTPMiddleware runs every request, and every streamed
    chunk, through a task group and a memory stream): the API key, the body limit however the body arrives,
    an OpenAI 500 for any exception a route lets out, and the request counter."""

    def __init__(self, app, config: GatewayConfig, metrics) -> None:
        self.app = app
        self.config = config
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        outcome = {"status": None, "final": None, "body_done": False}
        scope.setdefault("state", {})["trtpd_outcome"] = outcome   # a stream records how it ended here
        endpoint = _endpoint(scope["path"])
        try:
            refused = self._refusal(scope)
            if refused is not None:
                await self._answer(refused, outcome, send, close=refused.status == 413)
                return

            async def send_status(message) -> None:
                if message["type"] == "http.response.start":
                    outcome["status"] = message["status"]
                await send(message)

            try:
                await self.app(scope, self._bounded(receive, outcome), send_status)
            except _BodyTooLarge:
                if outcome["status"] is None:
                    await self._answer(ApiError(f"the request body is over the limit of {self.config.max_body_bytes} "
                                                f"bytes", "too_large"), outcome, send, close=True)
            except Exception as exc:   # noqa: BLE001 - the server's fault: a clean 500, counted, logged once
                log.exception("%s %s failed", scope.get("method"), scope["path"])
                outcome["final"] = 500
                if outcome["status"] is None:
                    await self._answer(ApiError(f"internal error: {type(exc).__name__}", "internal"), outcome, send,
                                       close=not outcome["body_done"])
        finally:
            status = outcome["final"] or outcome["status"]
            if endpoint is not None and status is not None:
                self.metrics.requests.labels(endpoint, str(status)).inc()

    @staticmethod
    async def _answer(exc: ApiError, outcome: dict, send, close: bool) -> None:
        outcome["status"] = exc.status

        async def nothing():
            return {"type": "http.disconnect"}
        await _error(exc, close=close)({"type": "http"}, nothing, send)

    def _refusal(self, scope) -> ApiError | None:
        """A body declared over the limit, or a protected path without a valid API key."""
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.config.max_body_bytes:
            return ApiError(f"request body of {length} bytes is over the limit of {self.config.max_body_bytes}",
                            "too_large")
        if self.config.api_keys and scope["path"].startswith(PROTECTED):
            given = headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not any(hmac.compare_digest(given.encode(), k.encode()) for k in self.config.api_keys):
                return ApiError("missing or wrong API key: send `Authorization: Bearer <key>`", "unauthorized",
                                code="invalid_api_key")
        return None

    def _bounded(self, receive, outcome: dict):
        """receive(), raising _BodyTooLarge once more than max_body_bytes arrived (a chunked body has no
        Content-Length to check up front): at most the limit is ever held."""
        limit, received = self.config.max_body_bytes, 0

        async def bounded():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge()
                if not message.get("more_body", False):
                    outcome["body_done"] = True
            return message
        return bounded


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
        return _error(exc)

    app.add_middleware(_Guard, config=config, metrics=metrics)

    def _admin(request: Request) -> None:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), service.admin_token.encode()):
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
        return {"now": time.time(), "requests": [s.to_dict() for s in service.samples_since(since)]}

    @app.put("/admin/instances/{name}")
    async def instance_state(name: str, request: Request):
        """{"state": "draining" | "ready"}; needs `Authorization: Bearer <admin token>` (FleetService.admin_token)."""
        _admin(request)
        try:
            state = json.loads(await request.body()).get("state")
        except (ValueError, AttributeError, RecursionError):
            raise ApiError('the body must be {"state": "draining" | "ready"}', "invalid_arg", "state") from None
        return service.set_instance_state(name, state)

    @app.post("/admin/generate")
    async def generate_tokens(request: Request):
        """A request in token ids from the fleet's Triton entry (TokenGenerateRequest), served as the OpenAI
        endpoints serve theirs (admission, cohort, metrics, samples). The answer streams newline-delimited JSON:
        one {"token_ids", "perf", "prefill_instance", "decode_instance"} per step, then {"done": true}, or
        {"error": {"message", "kind"}} if it fails after its first step; it starts with the first step, so a
        request refused or failed before it gets its status (429 with Retry-After, 400, 503)."""
        _admin(request)
        body = await _parse(request, TokenGenerateRequest)
        max_new = _max_new_tokens(service.config, "tokens", len(body.prompt_ids), body.max_new_tokens)
        sampling = SamplingInputs(max_new_tokens=max_new, temperature=body.temperature, top_p=body.top_p,
                                  top_k=body.top_k, seed=body.seed, end_id=body.end_id)
        try:
            ticket = service.admission.admit()
        except Overloaded as exc:
            raise ApiError(str(exc), "overloaded", retry_after_s=exc.retry_after_s) from None
        served = ServedRequest(service, ticket, body.request_id, body.prompt_ids, sampling)
        steps = served.steps()
        try:
            first = await _until_done(request, anext(steps, None))
        except BaseException:
            await served.close()
            raise
        return StreamingResponse(_token_lines(first, steps, served, request.scope["state"]["trtpd_outcome"]),
                                 media_type="application/x-ndjson")

    async def _token_lines(first, steps, served: ServedRequest, outcome: dict):
        def line(value: dict) -> bytes:
            return json.dumps(value).encode() + b"\n"

        def step(out) -> bytes:
            return line({"token_ids": out.token_ids, "perf": out.perf, "prefill_instance": out.prefill_instance,
                         "decode_instance": out.decode_instance})
        try:
            if first is not None:
                yield step(first)
                async for out in steps:
                    yield step(out)
            served.succeeded()
            yield line({"done": True})
        except OrchestratorError as exc:
            outcome["final"] = STATUS.get(exc.kind, 500)
            yield line({"error": {"message": str(exc), "kind": exc.kind}})
        finally:
            await served.close()

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

    # ---- the disagg cluster's storage (cluster_store.py): trtllm-serve workers register here --------------------
    def _member(request: Request) -> None:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), service.cluster_token.encode()):
            raise ApiError("missing or wrong cluster token: a worker registers with the deployment's key "
                           "(trtpd.kv.auth.cluster_token)", "unauthorized", code="invalid_cluster_token")

    def _result(value, changed: bool = False) -> JSONResponse:
        """Upstream's jsonify: {"result": value}, 200 when it is truthy, else 400."""
        if changed:
            service.cluster_changed()
        return JSONResponse({"result": value}, status_code=200 if value else 400)

    @app.post("/cluster/set", include_in_schema=False)
    async def cluster_set(request: Request):
        _member(request)
        try:
            item = await request.json()
            key, value = item["key"], item.get("value", "")
            ttl, overwrite = item.get("ttl", -1), item.get("overwrite_if_exists", False)
            if not (isinstance(key, str) and isinstance(value, str) and isinstance(ttl, (int, float))
                    and isinstance(overwrite, bool)):
                raise TypeError("key and value are strings, ttl a number, overwrite_if_exists a boolean")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ApiError(f"not a StorageItem: {exc}", "invalid_arg") from None
        from trtpd.schema.trtllm_serve import ProtocolError, WorkerInfo, workers_prefix
        if key.startswith(workers_prefix(config.cluster_name) + "/"):
            try:
                WorkerInfo.from_json(value)
            except ProtocolError as exc:
                raise ApiError(f"value: {exc}", "invalid_arg", "value") from None
        return _result(service.cluster.set(key, value, float(ttl), overwrite), changed=True)

    @app.get("/cluster/get", include_in_schema=False)
    async def cluster_get(request: Request, key: str):
        _member(request)
        return _result(service.cluster.get(key))

    @app.delete("/cluster/delete", include_in_schema=False)
    async def cluster_delete(request: Request, key: str):
        _member(request)
        return _result(service.cluster.delete(key), changed=True)

    @app.get("/cluster/expire", include_in_schema=False)
    async def cluster_expire(request: Request, key: str, ttl: float = -1):
        _member(request)
        return _result(service.cluster.expire(key, ttl))

    @app.get("/cluster/get_prefix", include_in_schema=False)
    async def cluster_get_prefix(request: Request, key_prefix: str, keys_only: int = 0):
        _member(request)
        return _result(service.cluster.get_prefix(key_prefix, bool(keys_only)))

    @app.get("/cluster_info", include_in_schema=False)
    async def cluster_info(request: Request):
        _member(request)
        return service.cluster_info()

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request):
        body = await _parse(request, CompletionRequest)
        return await _serve(request, "completions", body, body.prompt, "prompt",
                            body.max_tokens or config.default_max_tokens)

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat(request: Request):
        body = await _parse(request, ChatCompletionRequest)
        return await _serve(request, "chat", body, chat_prompt(body.messages), "messages", body.max_new_tokens)

    async def _serve(request: Request, endpoint: str, body, prompt: str, param: str, max_new_tokens: int | None):
        if body.model != config.model_name:
            raise ApiError(f"model {body.model!r} does not exist; this server serves {config.model_name!r}",
                           "not_found", "model", "model_not_found")
        prompt_ids = await _tokenize(service, prompt, param)
        max_new = _max_new_tokens(service.config, endpoint, len(prompt_ids), max_new_tokens)
        sampling = SamplingInputs(max_new_tokens=max_new, temperature=body.temperature, top_p=body.top_p,
                                  seed=body.seed if body.seed is not None else secrets.randbits(63),
                                  end_id=-1 if body.ignore_eos else config.eos_id)   # -1: no end id
        request_id = secrets.token_hex(8)
        shape = ResponseShape(endpoint, request_id, config.model_name)
        try:
            ticket = service.admission.admit()   # a slot or a queue place, reserved now; the wait is part of TTFT
        except Overloaded as exc:
            raise ApiError(str(exc), "overloaded", retry_after_s=exc.retry_after_s) from None
        generation = _Generation(service, ticket, request_id, prompt_ids, sampling, body.stop_strings)
        outcome = request.scope["state"]["trtpd_outcome"]
        if body.stream:
            relay = _Relay(generation.texts(), config.max_buffered_chunks, on_overflow=metrics.slow_clients.inc)
            try:
                first = await _until_done(request, relay.next())   # the first token, or the error before it
            except BaseException:
                relay.cancel()
                raise
            return StreamingResponse(_sse(relay, first, generation, shape, body.include_usage, outcome),
                                     media_type="text/event-stream")
        text, reason = await _until_done(request, generation.collect())
        # JSON-native already: a response as it is (FastAPI would walk the dict through jsonable_encoder)
        return JSONResponse(shape.whole(text, reason, len(prompt_ids), generation.num_tokens))

    async def _sse(relay: "_Relay", first: str | None, generation: "_Generation", shape: ResponseShape,
                   include_usage: bool, outcome: dict):
        started, status = False, CLIENT_GONE   # what the counter gets if the client leaves mid-stream
        try:
            text = first
            while text is not None:
                if text:
                    yield shape.chunk(text, first=not started)
                    started = True
                text = await relay.next()
            yield shape.chunk("", finish_reason=generation.finish_reason, first=not started)
            if include_usage:
                yield shape.usage_chunk(len(generation.prompt_ids), generation.num_tokens)
            status = 200
        except _SlowClient:
            return   # nothing more can reach a client that reads nothing; the send timeout closes it
        except OrchestratorError as exc:
            status = STATUS.get(exc.kind, 500)
            yield sse(error_body(str(exc), ERROR_TYPES[status]))
        except Exception as exc:   # never a silently truncated stream: the client hears that it failed
            log.exception("request %s failed", shape.id)
            status = 500
            yield sse(error_body(f"internal error: {type(exc).__name__}: {exc}", ERROR_TYPES[500]))
        finally:
            outcome["final"] = status
            relay.cancel()
        yield DONE

    return app


async def _tokenize(service: FleetService, prompt: str, param: str) -> list[int]:
    """The prompt's ids; refused without tokenizing when it has more characters than max_input_len tokens can
    hold; a long prompt is tokenized on a worker thread (the library releases the GIL) so the loop serves others."""
    tokenizer, max_input_len = service.tokenizer, service.config.max_input_len
    limit = max_input_len * tokenizer.max_token_chars
    if len(prompt) > limit:
        raise ApiError(f"the {param} has {len(prompt)} characters, more than {max_input_len} tokens (this model's "
                       f"limit) can hold (at most {tokenizer.max_token_chars} characters a token); shorten it",
                       "invalid_arg", param, "context_length_exceeded")
    try:
        if len(prompt) <= INLINE_TOKENIZE_CHARS:
            return tokenizer.encode(prompt)
        return await asyncio.to_thread(tokenizer.encode_off_thread, prompt)
    except InvalidTextError as exc:
        raise ApiError(f"{param}: {exc}", "invalid_arg", param) from None


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
    except RecursionError:
        raise ApiError("the request body nests JSON arrays or objects too deeply", "invalid_arg") from None
    except ValueError as exc:   # JSONDecodeError, UnicodeDecodeError, an integer over Python's digit limit
        raise ApiError(f"the request body is not valid JSON: {exc}", "invalid_arg") from None
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object", "invalid_arg")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = _field_errors(exc)
        raise ApiError("; ".join(f"{field or 'body'}: {msg}" for field, msg in errors), "invalid_arg",
                       errors[0][0]) from None
    except RecursionError:
        raise ApiError("the request body nests JSON arrays or objects too deeply", "invalid_arg") from None


def _field_errors(exc: ValidationError) -> list[tuple[str | None, str]]:
    """(field path, message) per failing field, once each: pydantic's locations name union members and
    validators too ("prompt.function-after[...]"); those parts are dropped."""
    seen: dict[str | None, str] = {}
    for error in exc.errors():
        parts = [str(p) for p in error["loc"] if isinstance(p, int) or str(p).isidentifier()]
        field = ".".join(parts) or None
        seen.setdefault(field, error["msg"].removeprefix("Value error, "))
    return list(seen.items())


def _max_new_tokens(config: GatewayConfig, endpoint: str, num_prompt_tokens: int, asked: int | None) -> int:
    """`endpoint`: completions, chat or tokens (POST /admin/generate): the fields an error names."""
    if num_prompt_tokens > config.max_input_len:
        raise ApiError(f"the prompt has {num_prompt_tokens} tokens, over this model's limit of "
                       f"{config.max_input_len}; shorten it", "invalid_arg",
                       {"chat": "messages", "tokens": "prompt_ids"}.get(endpoint, "prompt"), "context_length_exceeded")
    room = config.max_seq_len - num_prompt_tokens
    if asked is None:
        asked = min(room, config.chat_max_tokens_cap) if endpoint == "chat" else min(room, config.default_max_tokens)
    if asked > room:
        field = {"chat": "max_completion_tokens", "tokens": "max_new_tokens"}.get(endpoint, "max_tokens")
        raise ApiError(f"max_tokens {asked} plus the prompt's {num_prompt_tokens} tokens exceeds the context "
                       f"length {config.max_seq_len}; ask for at most {room}", "invalid_arg", field,
                       "context_length_exceeded")
    return asked


async def _until_done(request: Request, work):
    """Runs `work` (a coroutine) to its end; cancels it if the client disconnects meanwhile. Errors of the
    fleet become their HTTP status (the response has not started)."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=0.1)
            if not done and await request.is_disconnected():
                task.cancel()
                request.scope["state"]["trtpd_outcome"]["final"] = CLIENT_GONE
                raise ApiError("the client disconnected", "invalid_arg")
        return task.result()
    except OrchestratorError as exc:
        raise ApiError(str(exc), exc.kind, retry_after_s=1 if exc.kind == "unavailable" else None) from None
    finally:
        if not task.done():
            task.cancel()


class _SlowClient(Exception):
    """The client read nothing while its buffer filled: the generation behind it was cancelled."""


class _Relay:
    """A generation pulled by its own task into a buffer of at most `max_chunks`: when the client stops reading
    (the response's send blocks), the buffer fills and the generation is cancelled, so the instances stop
    computing for it and free its KV; the gateway never holds more than the buffer for one client."""

    def __init__(self, texts, max_chunks: int, on_overflow=lambda: None) -> None:
        self.buffer: deque[str] = deque()
        self.max_chunks = max_chunks
        self.on_overflow = on_overflow
        self.arrived = asyncio.Event()
        self.done = False
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._pull(texts))

    async def _pull(self, texts) -> None:
        try:
            async for text in texts:
                self.buffer.append(text)
                self.arrived.set()
                if len(self.buffer) > self.max_chunks:
                    self.error = _SlowClient()
                    self.on_overflow()
                    break
        except Exception as exc:   # noqa: BLE001 - handed to the reader, which answers with it
            self.error = exc
        finally:
            self.done = True
            self.arrived.set()
            await texts.aclose()   # its own finally releases the admission slot and cancels the instances' work

    async def next(self) -> str | None:
        """The next text, None at the end; raises what ended the generation early."""
        while not self.buffer:
            if self.done:
                if self.error is not None:
                    raise self.error
                return None
            self.arrived.clear()
            await self.arrived.wait()
        return self.buffer.popleft()

    def cancel(self) -> None:
        if not self.task.done():
            self.task.cancel()


class _Generation:
    """One request's generation: the service's steps (trtpd/gateway/service.py ServedRequest: admission,
    cohort, timing, metrics, sample) turned into stable text."""

    def __init__(self, service: FleetService, ticket, request_id: str, prompt_ids: list[int],
                 sampling: SamplingInputs, stop: list[str]) -> None:
        self.served = ServedRequest(service, ticket, request_id, prompt_ids, sampling)
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.detok = IncrementalDetokenizer(service.tokenizer, stop)
        self.num_tokens = 0
        self.finish_reason = "length"

    async def texts(self):
        """The stable text of each step; releases the admission slot and records metrics however it ends."""
        try:
            async for out in self.served.steps():
                text = self._take(out.token_ids)
                yield text
                if self.detok.stopped or self.finish_reason == "stop":
                    break
            yield self.detok.finish()
            # a stream that ends short of max_tokens stopped at the end id: TensorRT-LLM never outputs it (its
            # samplers finish the sequence without it; docs/twin.md), so its absence, not the token, says "stop"
            if self.detok.stopped or self.num_tokens < self.sampling.max_new_tokens:
                self.finish_reason = "stop"
            self.served.succeeded()
        finally:
            await self.served.close()

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
