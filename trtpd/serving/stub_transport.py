"""The single server's RoleTransport: a role model of this same Triton server, reached by BLS (runs in the stub).

One transport per client request and role model: it forwards the client's own input tensors unchanged, as
upstream 1.2.1's disaggregated_serving_bls does (create_context_request / create_generation_request), so stop
words, bad words, penalties, the embedding bias and the logits request reach the role model as the client sent
them; the orchestrator's SamplingInputs only size the request for the routing core. Every sub-request streams
(whatever the client asked), so tokens are relayed as they come and a client that left is noticed between them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpd.orchestration.transport import Phase, RoleChunk, RoleError, SamplingInputs
from trtpd.perf_outputs import PERF_OUTPUTS, perf_from_tensors
from trtpd.serving.pb import kind_of, tensor

ROLE_OUTPUTS = ["output_ids", "sequence_length", "context_phase_params"]


@dataclass(frozen=True)
class StubRouting:
    """What every sub-request of this BLS model carries besides the client's tensors."""

    kv_transfer: str                      # "layerwise" | "after_prefill"
    auth_key: bytes | None                # proves to the role model that the orchestrator sent it (kv/auth.py)
    requested_outputs: tuple[str, ...]    # ROLE_OUTPUTS and the perf outputs the role models declare


class StubTransport:
    """Role model `name` for one client request, whose forwarded tensors are `inputs` (plain arrays, not the
    request's pb_utils.Tensor objects: a tensor handed to two BLS requests shares one shared-memory buffer, and
    the python backend frees it twice). `on_outputs(outputs)` sees every response's tensors (the job keeps the
    generation logits it was asked for)."""

    def __init__(self, name: str, inputs: dict[str, np.ndarray], routing: StubRouting, wants_logits: bool,
                 on_outputs) -> None:
        self.name = name
        self.inputs = inputs
        self.routing = routing
        self.wants_logits = wants_logits
        self.on_outputs = on_outputs

    def _request(self, request_type: Phase, handle: bytes | None):
        params: dict = {"request_type": request_type} if request_type else {}
        if request_type == "context_only" and self.routing.kv_transfer == "layerwise" and not self.wants_logits:
            params["layerwise_kv_transfer"] = True   # the first token's logits come from prefill
        if self.routing.auth_key is not None:
            from trtpd.kv.auth import AUTH_PARAMETER, orchestrator_token
            params[AUTH_PARAMETER] = orchestrator_token(self.routing.auth_key, request_type,
                                                        self.inputs.get("input_ids"), time.time())
        inputs = [tensor(name, value) for name, value in self.inputs.items()]
        inputs.append(tensor("streaming", np.array([[True]], dtype=np.bool_)))
        if handle is not None:
            inputs.append(tensor("context_phase_params", np.frombuffer(handle, dtype=np.uint8).reshape(1, -1)))
        wanted = list(self.routing.requested_outputs) + (["generation_logits"] if self.wants_logits else [])
        return pb_utils.InferenceRequest(model_name=self.name, inputs=inputs, parameters=params,
                                         requested_output_names=wanted)

    async def stream(self, request_id: str, request_type: Phase, prompt_ids: list[int], sampling: SamplingInputs,
                     handle: bytes | None = None) -> AsyncIterator[RoleChunk]:
        responses = self._request(request_type, handle).exec(decoupled=True)
        ended = False
        try:
            for response in responses:
                if response.has_error():
                    ended = True   # the role model ended the sub-request with its error
                    raise RoleError(response.error().message(), kind_of(response.error()), self.name)
                outputs = {t.name(): t.as_numpy() for t in response.output_tensors()}
                self.on_outputs(outputs)
                ids = outputs.get("output_ids")
                blob = outputs.get("context_phase_params")
                perf = perf_from_tensors({n: float(outputs[n].reshape(-1)[0]) for n in PERF_OUTPUTS if n in outputs})
                yield RoleChunk([] if ids is None else [int(t) for t in ids.reshape(-1)],
                                handle=None if blob is None else blob.reshape(-1).astype(np.uint8).tobytes(),
                                perf=perf)
            ended = True
            yield RoleChunk([], final=True)
        finally:
            if not ended:   # closed before the final response: the client went away or a stop word ended it
                cancel = getattr(responses, "cancel", None)   # Triton 2.51's BLS response iterator has cancel()
                if cancel is not None:
                    cancel()

    async def close(self) -> None:
        pass
