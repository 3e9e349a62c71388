"""What crosses the boundary between an engine and its serving shell: requests in, outputs out."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from trtpd.engine.sampler import SamplingParams


class RequestType(str, enum.Enum):
    """TensorRT-LLM's request types (Triton request parameter `request_type`)."""

    CONTEXT_AND_GENERATION = "context_and_generation"
    CONTEXT_ONLY = "context_only"
    GENERATION_ONLY = "generation_only"


class RequestError(Exception):
    """A request the engine refuses; `kind` maps to a Triton error code."""

    def __init__(self, message: str, kind: str = "invalid_arg") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_new_tokens: int
    request_type: RequestType = RequestType.CONTEXT_AND_GENERATION
    sampling: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None
    streaming: bool = True
    context_phase_params: bytes | None = None
    arrival_s: float = 0.0
    # context_only: answer with the handle as soon as the request is scheduled, so decode pulls the KV
    # layer by layer while prefill computes (the first token then reaches decode with the KV)
    layerwise_kv_transfer: bool = False


@dataclass
class EngineOutput:
    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    sequence_length: int = 0             # prompt + generated tokens so far
    finished: bool = False
    finish_reason: str | None = None     # "length" | "stop" | "cancelled" | "error"
    error: str | None = None
    error_kind: str = "internal"
    context_phase_params: bytes | None = None
    perf: dict[str, float] = field(default_factory=dict)   # TTFT breakdown, seconds
