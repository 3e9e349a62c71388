"""The seam between the orchestrator and the role instances: one sub-request to one instance, streamed.

A RoleTransport carries the two hops of a disaggregated request, as TensorRT-LLM names them:
- `context_only` to a prefill instance: it prefills and answers with an opaque `handle` (what decode needs to
  pull the KV), perhaps with the first generated token (`token_ids`) and timings (`perf`);
- `generation_only` to a decode instance, with that handle: it pulls the KV and streams the tokens;
- `""` (a colocated instance): the whole request on one instance.

Implementations:
- Triton's gRPC stream to a role model (trtpd/transports/triton_grpc.py, RoleClient): the handle is the bytes of
  the `context_phase_params` tensor; the first token comes from decode (the reference backend's layerwise
  transfer), or from prefill and again from decode (TensorRT-LLM's after-prefill transfer; the orchestrator
  drops the repeat, see Orchestrator's first_token_at).
- trtllm-serve's two-hop HTTP protocol (a later issue; tensorrt_llm/serve/openai_protocol.py and
  openai_disagg_server.py at v1.2.1): the context request carries `disaggregated_params`
  {request_type: context_only}; its answer's `disaggregated_params` (`encoded_opaque_state`,
  `first_gen_tokens`, `ctx_request_id`, draft tokens) become the handle (serialized), and its
  `first_gen_tokens` the chunk's token_ids; the generation request sends them back with
  request_type generation_only. Its errors map onto RoleError's kinds by HTTP status (4xx invalid_arg,
  503/connection errors unavailable, other 5xx internal).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Phase = Literal["context_only", "generation_only", ""]


class RoleError(Exception):
    """A sub-request failed; `kind` says whose fault: invalid_arg (the client), unavailable (the instance is
    gone or refused for now), internal (a server fault). `transport`: the instance itself could not be reached
    or broke the stream (as opposed to the role model answering with an error)."""

    def __init__(self, message: str, kind: str, instance: str, transport: bool = False) -> None:
        super().__init__(message)
        self.kind = routed_kind(kind)
        self.instance = instance
        self.transport = transport


# a role model's verdict (trtpd/error_kinds.py's kinds) -> the three the routing core decides on
_ROUTED = {"invalid_arg": "invalid_arg", "unsupported": "invalid_arg", "unavailable": "unavailable",
           "cancelled": "unavailable"}


def routed_kind(kind: str) -> str:
    """The routing core's kind for a role model's error kind: the client's fault (invalid_arg, unsupported), the
    instance's for now (unavailable; cancelled: the instance ended the request, e.g. while it stopped), or a
    server fault (everything else)."""
    return _ROUTED.get(kind, "internal")


@dataclass
class SamplingInputs:
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    end_id: int = -1                  # -1: no end id (ignore EOS)
    return_generation_logits: bool = False   # each chunk carries its tokens' logits (generation_logits)
    # A Triton client's own request tensors (TensorRT-LLM's names: request_output_len, end_id, temperature,
    # stop_words_list, min_tokens, the penalties, ...; not input_ids, input_lengths or streaming), which the
    # single server's entry forwards as they came, as upstream's BLS does: the Triton transport then sends these
    # instead of the typed fields' tensors (which still say what the orchestrator and the routing core read);
    # another transport refuses what it cannot carry
    triton_inputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class RoleChunk:
    """One streamed response of a role instance."""

    token_ids: list[int]
    handle: bytes | None = None       # context_only: what decode needs to pull the KV
    perf: dict[str, float] = field(default_factory=dict)    # the instance's timings (trtpd/perf_outputs.py names)
    final: bool = False
    generation_logits: Any = None     # [1, 1, n, vocab] for this chunk's tokens (return_generation_logits)
    # context_only: the request ended in its context phase, at its first token (its end id, a stop word): there is
    # nothing to decode and nothing was exported (no handle); token_ids are the request's whole answer (none for an
    # end id, which is never output). TensorRT-LLM's Triton backend answers such a request with an error (the
    # Triton transport reads it, error_kinds.ended_in_context), trtllm-serve with a "stop" context answer
    ended: bool = False


class RoleTransport(Protocol):
    """One role instance, as the orchestrator reaches it."""

    name: str

    def stream(self, request_id: str, request_type: Phase, prompt_ids: list[int], sampling: SamplingInputs,
               handle: bytes | None = None) -> AsyncIterator[RoleChunk]:
        """Sends one sub-request and yields its responses until the final one (final=True). Raises RoleError
        when it fails. Closing the iterator before the final response cancels the sub-request on the instance
        (it frees the request's KV at once)."""
        ...

    async def close(self) -> None:
        """Closes the connection (after the last sub-request that uses it ended)."""
        ...

    # True: the instance reports a sub-request's timings only after it finished (request_perf); False: they come
    # on its chunks (RoleChunk.perf)
    reports_perf_later: bool

    async def request_perf(self, request_id: str) -> dict[str, float]:
        """The TTFT phases (trtpd/perf_outputs.py's seconds keys) the instance measured for this finished
        sub-request; {} when it has none (never raises)."""
        ...

    def kv_handle(self, handle: bytes) -> bytes | None:
        """The KV export's handle inside a prefill's `handle` (what a give-up names to the exporter); None when
        the instance's engine keeps no handle trtpd can name (it frees the export at its own timeout)."""
        ...
