"""Triton python model `disagg_bls`: the single server's orchestrator in front of its role models.

Disaggregated mode, per request (on its own thread, one sub-request at a time):
1. send the request to the prefill model with request_type=context_only;
2. send a generation_only request with the returned context_phase_params to the decode model and
   forward its streamed tokens.
kv_transfer=layerwise (reference engines): prefill answers with the signed handle as soon as the
batch is scheduled, so decode pulls the KV layer by layer while prefill still computes; decode
then streams every token, the first one included. kv_transfer=after_prefill (TensorRT-LLM's
semantics): prefill answers after it finished, with the first token, which is streamed at once
(TensorRT-LLM's own BLS does not stream it); decode's repeat of it is checked and dropped.
Sub-requests of one client request never overlap: Triton 2.51's python backend crashes the server
(boost::interprocess::lock_exception) when two BLS requests of the same parent are in flight.
A non-streaming request gets one response with all tokens. Colocated mode forwards the request to
the colocated model. Errors from either side reach the client as a Triton error.
"""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpd.engine.request import ends_with
from trtpd.perf_outputs import PERF_OUTPUTS as PERF_NAMES
from trtpd.perf_outputs import perf_to_tensors
from trtpd.serving.admission import Admission, Overloaded, Slot
from trtpd.serving.pb import error_response, kind_of, model_parameters, tensor
from trtpd.serving.request_parsing import parse_word_list
from trtpd.serving.stub_watch import StubWatch

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# the client's inputs the context and generation requests carry unchanged, as upstream 1.2.1's
# disaggregated_serving_bls create_context_request / create_generation_request forward them
FORWARDED = ("input_ids", "input_lengths", "request_output_len", "end_id", "temperature",
             "runtime_top_k", "runtime_top_p", "seed", "min_tokens", "stop_words_list", "bad_words_list",
             "return_generation_logits", "len_penalty", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "pad_id", "embedding_bias")
ROLE_OUTPUTS = ["output_ids", "sequence_length", "context_phase_params"]
DEFAULT_MAX_INFLIGHT = 24
DEFAULT_MAX_QUEUED = 1000


class BlsError(Exception):
    def __init__(self, message: str, kind: str = "invalid_arg") -> None:
        super().__init__(message)
        self.kind = kind


def _outputs(response) -> dict[str, np.ndarray]:
    if response.has_error():
        raise BlsError(response.error().message(), kind_of(response.error()))   # the role model's own code
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


def _auth_key(key_file: str) -> bytes | None:
    from trtpd.kv.handle import load_or_create_key_file
    return load_or_create_key_file(key_file) if key_file else None


def _tokens(outputs: dict) -> list[int]:
    ids = outputs.get("output_ids")
    return [] if ids is None else [int(t) for t in ids.reshape(-1)]


class _Job:
    """One client request's state."""

    def __init__(self, request) -> None:
        self.request = request
        self.sender = request.get_response_sender()
        # Plain arrays, not the request's pb_utils.Tensor objects: a tensor handed to two BLS requests that
        # run at once (prefill and decode overlap) shares one shared-memory buffer between them, and the
        # python backend frees it twice.
        self.inputs = {n: t.as_numpy().copy() for n in FORWARDED
                       if (t := pb_utils.get_input_tensor_by_name(request, n)) is not None}
        streaming = pb_utils.get_input_tensor_by_name(request, "streaming")
        self.streaming = bool(streaming is not None and streaming.as_numpy().reshape(-1)[0])
        self.max_tokens = int(self.inputs["request_output_len"].reshape(-1)[0])
        end = self.inputs.get("end_id")
        self.end_id = None if end is None or int(end.reshape(-1)[0]) < 0 else int(end.reshape(-1)[0])
        self.prompt_len = int(self.inputs["input_lengths"].reshape(-1)[0])
        self.stop_words = parse_word_list(self.inputs.get("stop_words_list"), "stop_words_list")
        self.tokens: list[int] = []
        self.perf: dict[str, np.ndarray] = {}
        self.finished = False
        self.lock = threading.Lock()   # one FINAL per job: its thread and the stub watch both may end it
        wants = self.inputs.get("return_generation_logits")
        self.wants_logits = bool(wants is not None and wants.reshape(-1)[0])
        self.logits: list[np.ndarray] = []   # [1, 1, n, vocab] pieces, sent with the final response

    def keep(self, outputs: dict) -> None:
        if self.wants_logits and outputs.get("generation_logits") is not None:
            self.logits.append(outputs["generation_logits"])

    def ended_by_engine(self) -> bool:
        """Its last token ends it in the engine too (its length), not only here (a stop word)."""
        return len(self.tokens) >= self.max_tokens

    def is_last(self, token: int) -> bool:
        """Whether `token` (just appended) ends the request here. Not the end id: TensorRT-LLM never outputs it
        (its samplers finish the sequence without it), so a request that stops at its end id is one whose
        stream ends (complete()), as does every stream; the length and stop words are seen in the tokens."""
        return len(self.tokens) >= self.max_tokens or any(ends_with(self.tokens, w) for w in self.stop_words)

    def send_tokens(self, new: list[int]) -> None:
        """Streams (or collects) tokens; sends FINAL with the last one."""
        with self.lock:
            for token in new:
                if self.finished:
                    return
                self.tokens.append(token)
                last = self.is_last(token)
                if self.streaming:
                    self._send([token], final=last)
                elif last:
                    self._send(self.tokens, final=True)
                self.finished = last

    def complete(self) -> None:
        """The role model's stream ended (its final response) before a token ended the request here: it stopped
        at its end id. Streaming: an empty final response; otherwise every token in one."""
        with self.lock:
            if not self.finished:
                self.finished = True
                self._send([] if self.streaming else self.tokens, final=True)

    def cancelled(self) -> bool:
        """The client went away (never asked after FINAL: tritonserver would touch a freed response factory)."""
        with self.lock:
            if self.finished or not self.sender.is_cancelled():
                return False
            self.finished = True
            return True

    def _send(self, tokens: list[int], final: bool) -> None:
        tensors = [tensor("output_ids", np.array(tokens, dtype=np.int32).reshape(1, 1, len(tokens))),
                   tensor("sequence_length", np.array([[self.prompt_len + len(self.tokens)]], dtype=np.int32))]
        if self.streaming:   # what postprocessing needs to detokenize this chunk alone (trtpd/detokenize.py)
            prefix = self.tokens[:len(self.tokens) - len(tokens)]
            if prefix:
                tensors.append(tensor("prefix_ids", np.array(prefix, dtype=np.int32).reshape(1, len(prefix))))
            tensors.append(tensor("is_final", np.array([[final]], dtype=np.bool_)))
        if final:
            tensors += [tensor(n, v) for n, v in self.perf.items()]
            if self.logits:
                tensors.append(tensor("generation_logits", np.concatenate(self.logits, axis=2)))
        self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if final else 0)

    def fail(self, message: str, kind: str = "invalid_arg") -> bool:
        with self.lock:
            if self.finished:
                return False
            self.finished = True
            self.sender.send(error_response(message, kind), flags=FINAL)
            return True


class DisaggBls:
    def initialize(self, args: dict) -> None:
        params = model_parameters(args)
        self.mode = params.get("mode", "disaggregated")
        self.context_model = params.get("context_model_name", "prefill")
        self.generation_model = params.get("generation_model_name", "decode")
        self.colocated_model = params.get("colocated_model_name", "colocated")
        self.kv_transfer = params.get("kv_transfer", "after_prefill")
        self.auth_key = _auth_key(params.get("kv_key_file", ""))   # None: role models that check nothing (GPU)
        # TensorRT-LLM role models have no perf outputs; ask only for what the role models declare
        extra = [n for n in params.get("perf_outputs", "").split(",") if n]
        self.requested_outputs = ROLE_OUTPUTS + extra
        if self.mode not in ("disaggregated", "colocated"):
            raise ValueError(f"disagg_bls: parameter mode={self.mode!r}; use disaggregated or colocated")
        if self.kv_transfer not in ("layerwise", "after_prefill"):
            raise ValueError(f"disagg_bls: parameter kv_transfer={self.kv_transfer!r}; use layerwise or after_prefill")
        if set(extra) - set(PERF_NAMES):
            raise ValueError(f"disagg_bls: unknown perf_outputs {sorted(set(extra) - set(PERF_NAMES))}")
        # fewer in-flight sub-requests than the python backend's 32 pool threads (see admission.py)
        self.admission = Admission(int(params.get("max_inflight_requests") or DEFAULT_MAX_INFLIGHT),
                                   int(params.get("max_queued_requests") or DEFAULT_MAX_QUEUED))
        # a dead role-model stub never answers: the watch fails every job at once (stub_watch.py)
        self.jobs: dict[_Job, Slot] = {}
        self.jobs_lock = threading.Lock()
        self.dead_message: str | None = None
        self.watch = StubWatch.from_env(args["model_name"], args.get("model_instance_name", ""), self._on_death,
                                        on_stopping=self._on_death)
        # a fleet's Triton entry: the role instances are other servers, routed by the routing core
        self.fleet = None
        if params.get("fleet_file"):
            from trtpd.serving.fleet_bridge import FleetBridge
            self.fleet = FleetBridge(params["fleet_file"])

    def _on_death(self, message: str) -> int:
        """Fails every in-flight job with `message` (UNAVAILABLE) and frees its slot; returns how many."""
        with self.jobs_lock:
            self.dead_message = message
            jobs = list(self.jobs.items())
        failed = 0
        for job, slot in jobs:
            failed += job.fail(message, "unavailable")
            slot.release()
        return failed

    def finalize(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self.fleet is not None:
            self.fleet.close()

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._serve, args=(request,), daemon=True).start()
        return None

    def _sub_request(self, job: _Job, model: str, params: dict, extra: list) -> object:
        """Every sub-request streams, whatever the client asked (upstream 1.2.1's BLS forwards the client's flag):
        tokens are relayed as they come, a client that left is noticed between tokens, and a non-streaming client
        still gets one response with every token. The context request's single response is the same either way."""
        if self.auth_key is not None:   # proves to the role model that the orchestrator sent it (kv/auth.py)
            from trtpd.kv.auth import AUTH_PARAMETER, orchestrator_token
            params = {**params, AUTH_PARAMETER: orchestrator_token(
                self.auth_key, params.get("request_type", ""), job.inputs.get("input_ids"), time.time())}
        inputs = [tensor(name, value) for name, value in job.inputs.items()]
        inputs += [tensor("streaming", np.array([[True]], dtype=np.bool_))] + extra
        wanted = self.requested_outputs + (["generation_logits"] if job.wants_logits else [])
        return pb_utils.InferenceRequest(model_name=model, inputs=inputs, parameters=params,
                                         requested_output_names=wanted)

    def _serve(self, request) -> None:
        try:
            job = _Job(request)
        except Exception as exc:  # missing required inputs
            request.get_response_sender().send(error_response(f"disagg_bls: bad request: {exc}"), flags=FINAL)
            return
        slot = Slot(self.admission)
        with self.jobs_lock:
            dead, self.jobs[job] = self.dead_message, slot
        try:
            if dead is not None:
                job.fail(dead, "unavailable")
                return
            slot.acquire()
            if job.finished:   # failed by the stub watch while it waited for a slot
                return
            if self.fleet is not None:
                self._through_fleet(job, slot)
            elif self.mode == "colocated":
                self._colocated(job, slot)
            else:
                self._disaggregated(job, slot)
            job.complete()   # the stream ended: what it gave is the answer (the end id is never a token)
        except Overloaded as exc:
            job.fail(str(exc), "unavailable")
        except BlsError as exc:
            job.fail(str(exc), exc.kind)
        except Exception as exc:
            job.fail(f"disagg_bls: {type(exc).__name__}: {exc}", "internal")
        finally:
            slot.release()
            with self.jobs_lock:
                self.jobs.pop(job, None)

    def _through_fleet(self, job: _Job, slot: Slot) -> None:
        """Prefill and decode on the fleet's instances (or a colocated one), through the fleet's gateway, which
        admits, routes, measures and samples the request as it does its OpenAI clients' (fleet_bridge.py)."""
        from trtpd.orchestration.transport import SamplingInputs
        from trtpd.serving.fleet_bridge import BridgeError

        def value(name: str, default, kind):
            return kind(job.inputs[name].reshape(-1)[0]) if name in job.inputs else default

        sampling = SamplingInputs(max_new_tokens=job.max_tokens, temperature=value("temperature", 0.0, float),
                                  top_p=value("runtime_top_p", 1.0, float), top_k=value("runtime_top_k", 0, int),
                                  seed=value("seed", 0, int), end_id=-1 if job.end_id is None else job.end_id)
        ids = [int(t) for t in job.inputs["input_ids"].reshape(-1)]
        try:
            request = self.fleet.serve(uuid.uuid4().hex[:16], ids, sampling)
        except BridgeError as exc:
            raise BlsError(str(exc), exc.kind) from None
        try:
            for step in request:
                slot.release()
                if job.cancelled():   # the client went away: closing the request cancels the remote one
                    return
                for name, value in perf_to_tensors(step["perf"]).items():   # seconds -> the tensors' ms
                    if name in PERF_NAMES and name not in job.perf:
                        dtype = np.int64 if name == "kv_transfer_bytes" else np.float32
                        job.perf[name] = np.array([[value]], dtype=dtype)
                job.send_tokens(step["token_ids"])
                if job.finished:
                    if job.ended_by_engine():   # the fleet ends it too: read its end, so it counts as served
                        request.finish()
                    return
        except BridgeError as exc:
            raise BlsError(str(exc), exc.kind) from None
        finally:
            request.close()

    def _keep_perf(self, job: _Job, outputs: dict) -> None:
        """First report wins: prefill's own timings over decode's view of them."""
        for name in PERF_NAMES:
            if name in outputs and name not in job.perf:
                job.perf[name] = outputs[name]

    def _colocated(self, job: _Job, slot: Slot) -> None:
        for response in self._sub_request(job, self.colocated_model, {}, []).exec(decoupled=True):
            slot.release()   # prefilled: the rest streams without holding a pool thread
            outputs = _outputs(response)
            self._keep_perf(job, outputs)
            job.keep(outputs)
            job.send_tokens(_tokens(outputs))

    def _disaggregated(self, job: _Job, slot: Slot) -> None:
        params = {"request_type": "context_only"}
        if self.kv_transfer == "layerwise" and not job.wants_logits:   # the first token's logits come from prefill
            params["layerwise_kv_transfer"] = True
        handle, first_token = None, None
        for response in self._sub_request(job, self.context_model, params, []).exec(decoupled=True):
            outputs = _outputs(response)
            self._keep_perf(job, outputs)
            job.keep(outputs)
            handle = outputs.get("context_phase_params", handle)
            tokens = _tokens(outputs)
            if tokens and first_token is None:
                first_token = tokens[0]
                job.send_tokens([first_token])
        if handle is None:
            raise BlsError(f"{self.context_model} returned no context_phase_params", "internal")
        # With request_output_len 1 prefill's token is the whole answer, but decode still pulls the KV
        # (and sends nothing more), so prefill frees it at once instead of at the transfer timeout.
        extra = [tensor("context_phase_params", handle.reshape(1, -1).astype(np.uint8))]
        skip_first = first_token is not None
        responses = self._sub_request(job, self.generation_model, {"request_type": "generation_only"},
                                      extra).exec(decoupled=True)
        for response in responses:
            slot.release()   # decode answered: the KV is pulled, the rest streams without a pool thread
            if job.cancelled():   # the client went away: stop decoding
                cancel = getattr(responses, "cancel", None)
                if cancel is not None:
                    cancel()
                return
            outputs = _outputs(response)
            self._keep_perf(job, outputs)
            job.keep(outputs)
            tokens = _tokens(outputs)
            if tokens and skip_first:
                skip_first = False
                if tokens[0] != first_token:
                    raise BlsError(f"decode's first token {tokens[0]} differs from prefill's {first_token}", "internal")
                tokens = tokens[1:]
            job.send_tokens(tokens)
