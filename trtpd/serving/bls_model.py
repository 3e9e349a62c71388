"""Triton python model `disagg_bls`: the single server's entry in front of its role models.

Each client request runs on a thread of its own through the one orchestrator (trtpd/orchestration/), the
gateway's: it lives on an event loop of this stub (orchestration/blocking.py) and reaches this server's prefill
and decode (or colocated) models over the server's own gRPC endpoint (trtpd/transports/triton_grpc.py, the
gateway's transport; own_server.py finds the endpoint), with the routing core deciding what a failed
sub-request means, as for a fleet. Not by BLS: Triton's python backend builds a BLS response's numpy arrays with
the GIL released (python_backend src/infer_request.cc, InferRequest::Exec), and with the orchestrator reading many
requests' responses at once the stub's heap was corrupted (docs/architecture.md).
1. a context_only request to the prefill model;
2. a generation_only request with the returned context_phase_params to the decode model, whose streamed
   tokens are forwarded.
kv_transfer=layerwise (reference engines): prefill answers with the signed handle as soon as the batch is
scheduled, so decode pulls the KV layer by layer while prefill still computes; decode then streams every token,
the first one included. kv_transfer=after_prefill (TensorRT-LLM's semantics): prefill answers after it finished,
with the first token, which is streamed at once (first_token_at="prefill"; TensorRT-LLM's own BLS does not
stream it); decode's repeat of it is checked and dropped. The client's inputs reach the role models as they came
(upstream 1.2.1's disaggregated_serving_bls forwards them), every sub-request streaming.
A non-streaming request gets one response with all tokens. Colocated mode sends the request to the colocated
model. Errors from either side reach the client as a Triton error with the role model's code.
A fleet's Triton entry (parameter fleet_file) hands each request to the fleet's gateway instead (fleet_bridge.py).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpd.engine.request import ends_with
from trtpd.orchestration.blocking import LoopThread
from trtpd.orchestration.orchestrator import Orchestrator, OrchestratorError
from trtpd.orchestration.transport import SamplingInputs
from trtpd.perf_outputs import PERF_OUTPUTS as PERF_NAMES
from trtpd.perf_outputs import perf_to_tensors
from trtpd.routing.core import InstanceView, Router, RoutingPolicy
from trtpd.serving.admission import Admission, Overloaded, Slot
from trtpd.serving.pb import error_response, model_parameters, tensor
from trtpd.serving.request_parsing import parse_word_list
from trtpd.serving.stub_watch import StubWatch

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# the client's inputs the context and generation requests carry unchanged, as upstream 1.2.1's
# disaggregated_serving_bls create_context_request / create_generation_request forward them
FORWARDED = ("input_ids", "input_lengths", "request_output_len", "end_id", "temperature",
             "runtime_top_k", "runtime_top_p", "seed", "min_tokens", "stop_words_list", "bad_words_list",
             "return_generation_logits", "len_penalty", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "pad_id", "embedding_bias")
DEFAULT_MAX_INFLIGHT = 24
DEFAULT_MAX_QUEUED = 1000


class BlsError(Exception):
    def __init__(self, message: str, kind: str = "invalid_arg") -> None:
        super().__init__(message)
        self.kind = kind


def _auth_key(key_file: str) -> bytes | None:
    from trtpd.kv.handle import load_or_create_key_file
    return load_or_create_key_file(key_file) if key_file else None


def _keep_perf(job: "_Job", perf: dict[str, float]) -> None:
    """First report wins (the orchestrator already puts prefill's own timings over decode's); seconds -> ms."""
    for name, value in perf_to_tensors(perf).items():
        if name in PERF_NAMES and name not in job.perf:
            job.perf[name] = np.array([[value]], dtype=np.int64 if name == "kv_transfer_bytes" else np.float32)


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
        self.steps = None    # the orchestrator's steps for this request, once they run (the stub watch cancels them)

    def sampling(self) -> SamplingInputs:
        """What the orchestrator and the routing core read, and the client's own tensors, forwarded as they came."""
        def value(name: str, default, kind):
            return kind(self.inputs[name].reshape(-1)[0]) if name in self.inputs else default

        forwarded = {n: v for n, v in self.inputs.items() if n not in ("input_ids", "input_lengths")}
        return SamplingInputs(max_new_tokens=self.max_tokens, temperature=value("temperature", 0.0, float),
                              top_p=value("runtime_top_p", 1.0, float), top_k=value("runtime_top_k", 0, int),
                              seed=value("seed", 0, int), end_id=-1 if self.end_id is None else self.end_id,
                              return_generation_logits=self.wants_logits, triton_inputs=forwarded)

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
        # the perf outputs trtpd's reference role models declare (TensorRT-LLM's declare none): checked here; the
        # transport asks each role model for those its metadata declares
        extra = [n for n in params.get("perf_outputs", "").split(",") if n]
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
        self.orchestration: _OwnServer | None = None
        if params.get("fleet_file"):
            from trtpd.serving.fleet_bridge import FleetBridge
            self.fleet = FleetBridge(params["fleet_file"])
        else:
            roles = ({self.colocated_model: "colocated"} if self.mode == "colocated" else
                     {self.context_model: "prefill", self.generation_model: "decode"})
            self.orchestration = _OwnServer(self.mode, roles, self.auth_key, self.kv_transfer == "layerwise",
                                            self.watch)

    def _on_death(self, message: str) -> int:
        """Fails every in-flight job with `message` (UNAVAILABLE) and frees its slot; returns how many."""
        with self.jobs_lock:
            self.dead_message = message
            jobs = list(self.jobs.items())
        failed = 0
        for job, slot in jobs:
            failed += job.fail(message, "unavailable")
            slot.release()
            if job.steps is not None:
                job.steps.cancel()    # its sub-request is cancelled too: the thread waiting on it moves on
        return failed

    def finalize(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self.fleet is not None:
            self.fleet.close()
        if self.orchestration is not None:
            self.orchestration.stop()

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._serve, args=(request,), daemon=True).start()
        return None

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
            else:
                self._orchestrated(job, slot)
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
        from trtpd.serving.fleet_bridge import BridgeError

        sampling = job.sampling()   # the gateway takes the typed fields (its /admin/generate body)
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
                _keep_perf(job, step["perf"])
                job.send_tokens(step["token_ids"])
                if job.finished:
                    if job.ended_by_engine():   # the fleet ends it too: read its end, so it counts as served
                        request.finish()
                    return
        except BridgeError as exc:
            raise BlsError(str(exc), exc.kind) from None
        finally:
            request.close()

    def _orchestrated(self, job: _Job, slot: Slot) -> None:
        """The one orchestrator over this server's role models (_OwnServer). After-prefill transfer: prefill's first
        token is sent at once and decode's repeat of it checked and dropped; layerwise: decode streams every token."""
        steps = job.steps = self.orchestration.steps(uuid.uuid4().hex[:16],
                                                     [int(t) for t in job.inputs["input_ids"].reshape(-1)],
                                                     job.sampling())
        try:
            for step in steps:
                if step.decode_instance is not None:
                    slot.release()   # decode answered (the KV is pulled): the rest streams without a slot
                if job.cancelled():   # the client went away: closing the steps cancels the sub-request
                    return
                _keep_perf(job, step.perf)
                job.logits.extend(step.generation_logits)
                job.send_tokens(step.token_ids)
                if job.finished and not job.ended_by_engine():
                    return   # a stop word ended it here: closing the steps cancels decode
                # ended by its length: read on to the end, so that decode still pulls the KV (with
                # request_output_len 1 prefill's token is the whole answer) and prefill frees it at once instead
                # of at the transfer timeout
        except OrchestratorError as exc:
            raise BlsError(str(exc), exc.kind) from None
        except concurrent.futures.CancelledError:
            return   # the stub watch failed the job (a role model's stub died) and cancelled its steps
        finally:
            steps.close()


class _OwnServer:
    """The orchestrator over this server's own role models, one instance each, on an event loop of this stub;
    the request threads take their steps from it (orchestration/blocking.py)."""

    def __init__(self, mode: str, roles: dict[str, str], key: bytes | None, layerwise: bool,
                 watch: StubWatch | None = None) -> None:
        self.mode, self.roles, self.key, self.layerwise = mode, roles, key, layerwise
        self.watch = watch       # whether a role model's stub still runs (a failed KV pull: prefill gone?)
        self.views = [InstanceView(model, role) for model, role in roles.items()]
        self.loop = LoopThread("disagg_bls-orchestrator")
        self.orchestrator: Orchestrator | None = None
        self.lock = threading.Lock()

    def _start(self) -> Orchestrator:
        from trtpd.serving.own_server import own_grpc_url
        from trtpd.transports.triton_grpc import RoleClient

        url = own_grpc_url()   # read at the first request: the server's endpoints are up by then

        async def clients():   # grpc's asyncio channels belong to the loop they are made on
            return {model: RoleClient(model, url, model, self.key, self.layerwise) for model in self.roles}

        router = Router(RoutingPolicy())
        return Orchestrator(self.mode, router, self.loop.run(clients()), first_token_at="prefill",
                            give_up=self._give_up, alive=self._alive if self.watch is not None else None)

    async def _alive(self, model: str) -> bool:
        """A generation request failed in TensorRT-LLM's words, which do not say whether its KV pull failed: the
        prefill model it pulled from is gone when its stub died (then it is prefilled again, and the stub watch
        ends it with the death's message)."""
        return self.watch.model_alive(model)

    def steps(self, request_id: str, prompt_ids: list[int], sampling: SamplingInputs):
        with self.lock:
            if self.orchestrator is None:
                self.orchestrator = self._start()
        return self.loop.steps(self._generate(request_id, prompt_ids, sampling))

    async def _generate(self, request_id: str, prompt_ids: list[int], sampling: SamplingInputs):
        # every request finds both role models ready: one marked unhealthy by an earlier request's failure (a full
        # queue, say) is not refused to every later one, as the gateway's load probes would clear it for a fleet
        self.orchestrator.router.update(self.views, time.monotonic())
        async for step in self.orchestrator.generate(request_id, prompt_ids, sampling):
            yield step

    def _give_up(self, instance: str, sub_request_id: str, handle: bytes | None) -> None:
        """A prefill export no decode will pull: prefill frees it now, not at the export's deadline (by its
        handle; without one, the deadline frees it)."""
        if handle is None or self.key is None:
            return
        from trtpd.kv.importer import give_up_best_effort
        self.loop.loop.run_in_executor(None, give_up_best_effort, self.key, handle)

    def stop(self) -> None:
        if self.orchestrator is not None:
            for client in self.orchestrator.clients.values():
                try:
                    self.loop.run(client.close(), timeout_s=2.0)
                except Exception:   # noqa: BLE001 - the server is going away
                    pass
        self.loop.stop()
