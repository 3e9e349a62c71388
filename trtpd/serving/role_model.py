"""Triton python model for a reference-engine role (prefill, decode or colocated).

Decoupled: `execute` validates each request (clear INVALID_ARG errors, the server stays up),
hands it to the engine thread and returns; outputs come back through each request's response
sender. Streaming requests get one response per new token; others one response at the end.
A watcher thread turns client cancellations into engine aborts and publishes metrics.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpd import error_kinds
from trtpd.engine.engine_config import Role
from trtpd.engine.loader import KvTransferOptions, load_engine
from trtpd.engine.loop import EngineLoop
from trtpd.engine.request import EngineOutput, RequestError, RequestType
from trtpd.errors import TrtpdError
from trtpd.kv.auth import AUTH_PARAMETER, check_orchestrator_token
from trtpd.perf_outputs import ENGINE_PERF_MS as PERF_OUTPUTS
from trtpd.serving.metrics import RoleModelMetrics
from trtpd.serving.pb import (error_response, executor_failed_response, input_getter, model_parameters, tensor,
                              trtllm_error_response)
from trtpd.serving.request_parsing import error_kind, parse_parameters, parse_request
from trtpd.serving.stub_watch import StubWatch

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger(__name__)


@dataclass
class _Active:
    sender: object
    streaming: bool
    tokens: list[int] = field(default_factory=list)
    perf: dict[str, float] = field(default_factory=dict)
    handle: bytes | None = None
    logits: list[np.ndarray] = field(default_factory=list)
    context_only: bool = False


def perf_tensors(perf: dict[str, float]) -> list:
    out = [tensor(name, np.array([[perf[key] * 1000.0]], dtype=np.float32))
           for key, name in PERF_OUTPUTS.items() if key in perf]
    if "kv_bytes" in perf:
        out.append(tensor("kv_transfer_bytes", np.array([[int(perf["kv_bytes"])]], dtype=np.int64)))
    return out


class RoleModel:
    def initialize(self, args: dict) -> None:
        params = model_parameters(args)
        self.model_name = args["model_name"]
        self.role = Role(params["role"])
        kv = KvTransferOptions(transport=params.get("kv_transport", "shm"),
                               key_file=Path(params["kv_key_file"]) if params.get("kv_key_file") else None,
                               timeout_ms=int(params.get("kv_transfer_timeout_ms") or 30000),
                               host=params.get("kv_host") or "127.0.0.1", port=int(params.get("kv_port") or 0),
                               advertise_host=params.get("kv_advertise_host") or "")
        if kv.key_file is None:
            raise TrtpdError(f"{self.model_name}: parameter kv_key_file is required: requests are accepted only "
                             f"with the orchestrator's proof made with that key (trtpd/kv/auth.py)")
        from trtpd.kv.handle import load_or_create_key_file
        self.auth_key = load_or_create_key_file(kv.key_file)
        self.loaded = load_engine(Path(params["engine_dir"]), kv, self.role)
        self.active: dict[str, _Active] = {}
        # One lock over `active` and every response-sender call: a sender must never be asked
        # is_cancelled() after its FINAL response went out (tritonserver dereferences the freed
        # response factory and crashes), and senders are not safe to use from two threads at once.
        self.lock = threading.Lock()
        self.metrics = RoleModelMetrics(self.model_name, args.get("model_version", "1"),
                                   params.get("instance_name") or self.model_name, self.role.value)
        self.metrics.set_batch_invariance(self.loaded.invariance.max_rows, self.loaded.invariance.tile_rows)
        # Responses go out on their own thread: a python-backend send is a blocking IPC round trip, and
        # the engine thread should be computing the next step meanwhile (TensorRT-LLM's backend does the same).
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._responder = threading.Thread(target=self._respond, name=f"{self.model_name}-respond", daemon=True)
        self._responder.start()
        self.loop = EngineLoop(self.loaded.engine, self.outbox.put, name=f"{self.model_name}-engine",
                               step_delay_s=int(params.get("step_delay_ms") or 0) / 1000.0)
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"{self.model_name}-watch", daemon=True)
        self._watcher.start()
        # registers this stub; stops the deployment when a peer stub dies, exits when tritonserver does
        self.stub_watch = StubWatch.from_env(self.model_name, args.get("model_instance_name", ""),
                                             on_stopping=self._fail_all)

    # ---- requests in ----------------------------------------------------------------------
    def execute(self, requests):
        now = time.monotonic()
        for request in requests:
            sender = request.get_response_sender()
            client_id = request.request_id()   # the client's id, kept readable; the suffix makes it unique
            request_id = f"{client_id}-{uuid.uuid4().hex[:8]}" if client_id else uuid.uuid4().hex
            try:
                parameters = parse_parameters(request.parameters())
                # only the orchestrator may drive a role model: a local user sending context_only requests
                # straight to prefill could otherwise pin its KV blocks, and decode could be made to pull
                check_orchestrator_token(self.auth_key, parameters.get(AUTH_PARAMETER),
                                         str(parameters.get("request_type") or ""), input_getter(request)("input_ids"),
                                         time.time(), f"model {self.model_name!r}")
                req = parse_request(input_getter(request), parameters, request_id, now)
                self.loaded.engine.validate(req)
            except (RequestError, TrtpdError, ValueError) as exc:
                sender.send(error_response(str(exc), error_kind(exc)), flags=FINAL)
                continue
            with self.lock:
                self.active[request_id] = _Active(sender, req.streaming,
                                                  context_only=req.request_type is RequestType.CONTEXT_ONLY)
            self.loop.submit(req)
        return None

    # ---- outputs out ----------------------------------------------------------------------
    def _respond(self) -> None:
        while (out := self.outbox.get()) is not None:
            try:
                self._on_output(out)
            except Exception:   # a broken response channel must not stop the others
                log.exception("sending the response for request %s failed", out.request_id)

    def _on_output(self, out: EngineOutput) -> None:
        if "kv_transfer_s" in out.perf:
            self.metrics.record_transfer(out.perf["kv_transfer_s"])
        with self.lock:
            active = self.active.get(out.request_id)
            if active is None:
                return
            if out.finished:
                del self.active[out.request_id]
            self._deliver(active, out)

    def _deliver(self, active: _Active, out: EngineOutput) -> None:
        if out.error is not None:   # what the engine failed once admitted (a KV pull, a step): TensorRT-LLM's words
            response = error_response(out.error, out.error_kind) if out.error_kind == "invalid_arg" else \
                executor_failed_response(out.request_id, out.error)
            active.sender.send(response, flags=FINAL)
            return
        if out.finish_reason == "cancelled":
            active.sender.send(flags=FINAL)
            return
        active.perf.update(out.perf)
        active.handle = out.context_phase_params or active.handle
        if active.context_only and active.handle is None:
            # a context-only request the engine ended at its first token (its end id, a stop word) has no context
            # phase params, and the tensorrtllm backend's fillTritonResponse throws on such a response: INTERNAL,
            # untagged, final (error_kinds.CONTEXT_PARAMS_MISSING; the engine kept no KV for it)
            active.sender.send(trtllm_error_response(error_kinds.context_params_missing()), flags=FINAL)
            return
        if active.streaming:
            if out.new_token_ids or out.context_phase_params or out.finished:
                logits = [] if out.generation_logits is None else [out.generation_logits]
                active.sender.send(self._response(out.new_token_ids, out.context_phase_params, out.perf, logits),
                                   flags=FINAL if out.finished else 0)
            return
        active.tokens.extend(out.new_token_ids)
        if out.generation_logits is not None:
            active.logits.append(out.generation_logits)
        if out.finished:
            active.sender.send(self._response(active.tokens, active.handle, active.perf, active.logits),
                               flags=FINAL)

    def _response(self, tokens: list[int], handle: bytes | None, perf: dict, logits: list[np.ndarray]):
        """As the tensorrtllm backend fills a response (fillTritonResponse, triton_backend/inflight_batcher_llm/src/
        model_instance_state.cc): output_ids [1, 1, n] holds this response's tokens (streaming: the new ones, which
        may be none, on the final response after the end id) and sequence_length [1, 1] their number n (the
        output excludes the prompt, as with exclude_input_in_output)."""
        tensors = [tensor("output_ids", np.array([[tokens]], dtype=np.int32).reshape(1, 1, len(tokens))),
                   tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32))]
        if handle:
            tensors.append(tensor("context_phase_params", np.frombuffer(handle, dtype=np.uint8).reshape(1, -1)))
        tensors += perf_tensors(perf)
        if logits:   # TensorRT-LLM's layout: [batch 1, beam 1, tokens, vocab]
            tensors.append(tensor("generation_logits", np.concatenate(logits)[None, None]))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    # ---- cancellation and metrics ---------------------------------------------------------
    def _watch(self) -> None:
        last_metrics = 0.0
        while not self._stop.wait(0.05):
            with self.lock:
                cancelled = [rid for rid, a in self.active.items() if a.sender.is_cancelled()]
                for rid in cancelled:
                    del self.active[rid]
            for rid in cancelled:
                self.loop.abort(rid)
            now = time.monotonic()
            if now - last_metrics >= 0.1:
                last_metrics = now
                try:
                    self.metrics.update(self.loaded.engine.stats(), self.loaded.config.max_batch_size)
                except Exception:
                    pass

    def _fail_all(self, message: str) -> None:
        """Ends every request in flight with UNAVAILABLE `message` and aborts it in the engine (frees its KV)."""
        with self.lock:
            active, self.active = self.active, {}
            for a in active.values():
                a.sender.send(error_response(message, "unavailable"), flags=FINAL)
        for request_id in active:
            self.loop.abort(request_id)

    def finalize(self) -> None:
        if getattr(self, "stub_watch", None) is not None:
            self.stub_watch.stop()   # an orderly exit, not a death
        self._stop.set()
        self._watcher.join(1.0)
        self.loop.stop(timeout_s=2.0)   # at most one step more: the server is going away
        self.outbox.put(None)
        self._responder.join(1.0)
        self.loaded.close()
