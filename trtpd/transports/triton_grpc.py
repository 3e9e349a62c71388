"""One sub-request to a role instance over Triton's gRPC stream (tritonclient.grpc.aio): the first RoleTransport
(trtpd/orchestration/transport.py). The gateway reaches a fleet's instances with it; the single server's entry
(trtpd/serving/bls_model.py) reaches its own server's role models with it.

The tensors and parameters are TensorRT-LLM's `tensorrt_llm` interface, as upstream's disaggregated BLS
(triton_backend/all_models/disaggregated_serving/disaggregated_serving_bls at v1.2.1) sends them: the client's
inputs, `request_type` context_only / generation_only, the `context_phase_params` handle (signed by trtpd's
reference prefill), and the orchestrator's `trtpd_auth` token that trtpd's role models require.
A context-only sub-request whose first token ended the request is answered by TensorRT-LLM's backend (and the twin)
with an error, "contextParams must be present in the response" (error_kinds.CONTEXT_PARAMS_MISSING): read as the
request's end (RoleChunk.ended), not as a failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from trtpd.kv.auth import AUTH_PARAMETER, orchestrator_token
from trtpd.orchestration.transport import RoleChunk, RoleError, SamplingInputs
from trtpd.perf_outputs import PERF_OUTPUTS as PERF_NAMES
from trtpd.perf_outputs import perf_from_tensors
from trtpd import error_kinds

OUTPUTS = ("output_ids", "sequence_length", "context_phase_params") + PERF_NAMES
LOGITS = "generation_logits"


def sampling_tensors(sampling: SamplingInputs) -> dict[str, np.ndarray]:
    """The sampling inputs as the role models' tensors (TensorRT-LLM's `tensorrt_llm` model interface)."""
    return {"request_output_len": np.array([[sampling.max_new_tokens]], np.int32),
            "end_id": np.array([[sampling.end_id]], np.int32),
            "temperature": np.array([[sampling.temperature]], np.float32),
            "runtime_top_p": np.array([[sampling.top_p]], np.float32),
            "runtime_top_k": np.array([[sampling.top_k]], np.int32),
            "seed": np.array([[sampling.seed]], np.uint64),
            "streaming": np.array([[True]], np.bool_)}


def _role_error(message: str, instance: str) -> RoleError:
    """The role model's own verdict travels as a tag in the message (trtpd/error_kinds.py); an untagged error is
    TensorRT-LLM's backend failing this request (its words say so: internal) or else came from Triton itself (a
    model gone, a stub that died): the instance is unavailable."""
    text, kind = error_kinds.parse(message)
    return RoleError(text, kind or error_kinds.untagged_kind(text) or "unavailable", instance)


def _infer_inputs(tensors: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, value in tensors.items():
        t = grpcaio.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        t.set_data_from_numpy(value)
        inputs.append(t)
    return inputs


class RoleClient:
    """A gRPC connection to one instance (kept open; calls multiplex over it): a RoleTransport.
    key: the deployment key that signs the orchestrator's token (None: role models that check none, TensorRT-LLM's).
    layerwise: ask prefill for the layerwise KV transfer (trtpd's reference role models; TensorRT-LLM ignores it)."""

    def __init__(self, name: str, url: str, model: str, key: bytes | None, layerwise: bool = True) -> None:
        self.name = name
        self.model = model
        self.key = key
        self.layerwise = layerwise
        self.client = grpcaio.InferenceServerClient(url)
        self._outputs: tuple[str, ...] | None = None
        self._has_logits = False

    async def outputs(self) -> tuple[str, ...]:
        """The outputs of OUTPUTS the role model declares, from its model metadata (read once): trtpd's reference
        role models declare the perf outputs, TensorRT-LLM's `tensorrt_llm` model does not, and Triton refuses a
        request for an output its model does not declare."""
        if self._outputs is None:
            try:
                meta = await self.client.get_model_metadata(self.model, as_json=True)
            except InferenceServerException as exc:
                raise RoleError(f"instance {self.name}: no metadata for model {self.model}: {exc.message()}",
                                "unavailable", self.name, transport=True) from None
            declared = {o["name"] for o in meta.get("outputs", [])}
            self._outputs = tuple(n for n in OUTPUTS if n in declared)
            self._has_logits = LOGITS in declared
        return self._outputs

    async def close(self) -> None:
        await self.client.close()

    reports_perf_later = False    # the role models' timings come on their responses (perf outputs)

    async def request_perf(self, request_id: str) -> dict[str, float]:
        return {}

    def kv_handle(self, handle: bytes) -> bytes | None:
        return handle   # the role models' handle is the signed KV handle itself

    async def stream(self, request_id: str, request_type: str, prompt_ids: list[int], sampling: SamplingInputs,
                     handle: bytes | None = None) -> AsyncIterator[RoleChunk]:
        """Sends one request and yields its responses until the final one; cancels it if the consumer stops."""
        ids = np.array([prompt_ids], dtype=np.int32)
        # a Triton client's own tensors go as they came (upstream's BLS forwards them unchanged), else the typed ones
        sent = dict(sampling.triton_inputs) or sampling_tensors(sampling)
        tensors = {**sent, "input_ids": ids, "input_lengths": np.array([[len(prompt_ids)]], np.int32),
                   "streaming": np.array([[True]], np.bool_)}
        if handle is not None:
            tensors["context_phase_params"] = np.frombuffer(handle, dtype=np.uint8).reshape(1, -1)
        params = {} if self.key is None else {
            AUTH_PARAMETER: orchestrator_token(self.key, request_type, ids, time.time())}
        if request_type:
            params["request_type"] = request_type
        # the first token's logits come from prefill's own answer: no layerwise transfer when they are asked for
        if request_type == "context_only" and self.layerwise and not sampling.return_generation_logits:
            params["layerwise_kv_transfer"] = True
        outputs = await self.outputs()
        if sampling.return_generation_logits:
            if not self._has_logits:
                raise RoleError(f"instance {self.name}: model {self.model} has no {LOGITS} output",
                                "invalid_arg", self.name)
            tensors["return_generation_logits"] = np.array([[True]], np.bool_)
            outputs += (LOGITS,)
        done = asyncio.Event()

        async def requests():
            yield {"model_name": self.model, "inputs": _infer_inputs(tensors), "request_id": request_id,
                   "parameters": params, "enable_empty_final_response": True,
                   "outputs": [grpcaio.InferRequestedOutput(n) for n in outputs]}
            await done.wait()    # keep the stream open until the final response came

        responses = self.client.stream_infer(inputs_iterator=requests())
        complete = False
        try:
            async for result, error in responses:
                if error is not None:
                    message = error.message() if isinstance(error, InferenceServerException) else str(error)
                    if request_type == "context_only" and error_kinds.ended_in_context(message):
                        # TensorRT-LLM's backend fails a context-only response that has no context phase params,
                        # which is what a request that ended at its first token (its end id, a stop word) gets:
                        # the request's end, with nothing exported (error_kinds.CONTEXT_PARAMS_MISSING), not a
                        # failure to retry elsewhere. The error was its final response
                        complete = True
                        yield RoleChunk([], final=True, ended=True)
                        return
                    raise _role_error(message, self.name)
                chunk = _chunk(result)
                complete = chunk.final
                yield chunk
                if complete:
                    return
            raise RoleError(f"instance {self.name} closed the stream before the final response", "unavailable",
                            self.name, transport=True)
        except InferenceServerException as exc:   # connection refused, instance gone
            raise RoleError(f"instance {self.name}: {exc.message()}", "unavailable", self.name,
                            transport=True) from None
        except grpc.RpcError as exc:   # the stream broke (the instance's server died mid-request)
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise RoleError(f"instance {self.name}: the stream broke ({details})", "unavailable", self.name,
                            transport=True) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():   # our caller is being cancelled: let it go
                raise
            # grpc cancelled the call under us (the channel closed): the request failed, say so, never end
            # the client's stream as if it were complete
            raise RoleError(f"instance {self.name}: the call was cancelled (its connection closed)", "unavailable",
                            self.name, transport=True) from None
        finally:
            # the request stream ends (half-close) once done is set; a call that did not get its final response
            # (an error, or the consumer stopped early) is cancelled, so that the instance frees its KV at once.
            # A complete one is not: cancelling it would fail the request stream's writer, which grpc then
            # formats a traceback for, at every request
            done.set()
            if not complete:
                responses.cancel()


def _chunk(result) -> RoleChunk:
    ids = result.as_numpy("output_ids")
    handle = result.as_numpy("context_phase_params")
    values = {}
    for name in PERF_NAMES:
        value = result.as_numpy(name)
        if value is not None and value.size:
            values[name] = float(value.reshape(-1)[0])
    perf = perf_from_tensors(values)     # seconds from here on (the tensors carry milliseconds)
    final = result.get_response().parameters.get("triton_final_response")
    logits = result.as_numpy(LOGITS)
    return RoleChunk([] if ids is None else [int(t) for t in ids.reshape(-1)],
                     None if handle is None or not handle.size else handle.astype(np.uint8).tobytes(), perf,
                     bool(final is not None and final.bool_param),
                     None if logits is None or not logits.size else logits)
