"""What crosses the boundary between an engine and its serving shell: requests in, outputs out."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trtpd.engine.sampler import SamplingParams

if TYPE_CHECKING:
    import numpy as np
    import torch

log = logging.getLogger(__name__)


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
    stop_words: list[list[int]] = field(default_factory=list)   # finish when the output ends with one
    bad_words: list[list[int]] = field(default_factory=list)    # never complete one of these
    min_tokens: int = 0                                          # end_id is not sampled before this many
    return_generation_logits: bool = False                       # each sampled token's logits row comes back

    def banned_tokens(self, generated: list[int]) -> set[int]:
        """Tokens the next sample must not pick: the last token of each bad word whose other tokens end
        the sequence so far, and end_id while fewer than min_tokens tokens were generated."""
        history = self.prompt_token_ids + generated
        banned = {w[-1] for w in self.bad_words if w and ends_with(history, w[:-1])}
        if self.end_id is not None and len(generated) < self.min_tokens:
            banned.add(self.end_id)
        return banned

    def hits_stop_word(self, generated: list[int]) -> bool:
        return any(w and ends_with(generated, w) for w in self.stop_words)


def ends_with(tokens: list[int], suffix: list[int]) -> bool:
    return not suffix or (len(tokens) >= len(suffix) and tokens[-len(suffix):] == suffix)


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
    generation_logits: "np.ndarray | None" = None        # [len(new_token_ids), vocab] float32, when asked


def forward_each_on_failure(run: "Callable[[list], torch.Tensor]", items: list, what: str) -> list:
    """Each item's logits row, or the exception its forward pass raised. A failed batch is rerun item by
    item (rows do not depend on their batch, see row_tiles.py), so only the culprit fails; rewriting the
    KV of the others puts the same values in the same slots."""
    if not items:
        return []
    try:
        logits = run(items)
        return [logits[i] for i in range(len(items))]
    except Exception as exc:
        if len(items) == 1:
            return [exc]
        log.warning("a forward pass of %d %s failed (%s: %s); rerunning them one by one",
                    len(items), what, type(exc).__name__, exc)
    results = []
    for item in items:
        try:
            results.append(run([item])[0])
        except Exception as exc:
            results.append(exc)
    return results


def logits_rows(logits: torch.Tensor) -> np.ndarray:
    """One sampled row's logits as TensorRT-LLM returns generation logits: [1, vocab] float32, a copy."""
    return logits.detach().float().reshape(1, -1).numpy().copy()


def check_tokens(request: EngineRequest, vocab_size: int) -> None:
    """Every token id the request carries must be in the vocabulary [0, vocab_size)."""
    who = f"request {request.request_id}"
    bad = next(((i, t) for i, t in enumerate(request.prompt_token_ids) if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(f"{who}: input_ids[{bad[0]}] = {bad[1]} is outside the vocabulary [0, {vocab_size})")
    for name, words in (("stop_words_list", request.stop_words), ("bad_words_list", request.bad_words)):
        wrong = [t for w in words for t in w if not 0 <= t < vocab_size]
        if wrong:
            raise RequestError(f"{who}: {name} holds token id {wrong[0]}, outside the vocabulary [0, {vocab_size})")
    if request.end_id is not None and request.end_id >= vocab_size:
        raise RequestError(f"{who}: end_id {request.end_id} is outside the vocabulary [0, {vocab_size}) "
                           f"(send -1 for none)")
    if request.sampling.top_k > vocab_size:
        raise RequestError(f"{who}: runtime_top_k must be <= the vocabulary size {vocab_size}, "
                           f"got {request.sampling.top_k}")
