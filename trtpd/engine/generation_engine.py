"""What the decode and colocated engines share: continuous batching of decode steps.

A step feeds each ready sequence its last token, samples the next one row by row, and finishes a
sequence at max_new_tokens or its end_id. Subclasses say how sequences become ready: the decode
engine pulls their KV from a prefill instance, the colocated engine prefills them inside the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trtpd.engine.engine_config import EngineConfig
from trtpd.engine.model import LlamaModel, SeqChunk
from trtpd.engine.protocol import EngineHooks
from trtpd.engine.request import (EngineOutput, EngineRequest, RequestError, check_tokens,
                                  forward_each_on_failure, logits_rows)
from trtpd.engine.sampler import sample
from trtpd.kv.pool import KvPool
from trtpd.sched.block_allocator import BlockAllocator
from trtpd.sched.continuous import BatchSchedulerConfig, ContinuousBatchScheduler, SchedSequence



@dataclass
class Sequence:
    request: EngineRequest
    sched: SchedSequence
    output_token_ids: list[int] = field(default_factory=list)
    perf: dict[str, float] = field(default_factory=dict)
    answered: bool = False        # an output (with its perf) went out for it

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return self.sched.num_prompt_tokens


class GenerationEngine:
    prefill_in_step = False

    def __init__(self, config: EngineConfig, model: LlamaModel, pool: KvPool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.model = model
        self.pool = pool
        self.clock = clock
        self.allocator = BlockAllocator(pool.num_blocks, config.tokens_per_block)
        self.scheduler = ContinuousBatchScheduler(
            BatchSchedulerConfig(max_batch_size=config.max_batch_size, max_num_tokens=config.max_num_tokens,
                                 prefill_in_step=self.prefill_in_step), self.allocator)
        self.sequences: dict[str, Sequence] = {}
        self.num_completed = 0

    def _check_lengths(self, request: EngineRequest, num_prompt_tokens: int) -> None:
        if num_prompt_tokens == 0:
            raise RequestError(f"request {request.request_id}: empty prompt (input_lengths 0)")
        if num_prompt_tokens > self.config.max_input_len:
            raise RequestError(f"request {request.request_id}: prompt has {num_prompt_tokens} tokens, above this "
                               f"engine's max_input_len {self.config.max_input_len}; shorten the prompt")
        if request.max_new_tokens < 1:
            raise RequestError(f"request {request.request_id}: request_output_len must be >= 1, got {request.max_new_tokens}")
        if num_prompt_tokens + request.max_new_tokens > self.config.max_seq_len:
            raise RequestError(f"request {request.request_id}: prompt ({num_prompt_tokens}) + request_output_len "
                               f"({request.max_new_tokens}) exceeds max_seq_len {self.config.max_seq_len}; "
                               f"ask for at most {self.config.max_seq_len - num_prompt_tokens} tokens")
        check_tokens(request, self.model.spec.vocab_size)

    def _admit(self, request: EngineRequest, num_prompt_tokens: int) -> Sequence:
        sched = SchedSequence(request.request_id, num_prompt_tokens, request.max_new_tokens, request.arrival_s)
        seq = Sequence(request, sched)
        self.scheduler.add(sched)
        self.sequences[request.request_id] = seq
        return seq

    def bind(self, hooks: EngineHooks) -> None:
        """Nothing to hook (a colocated engine steps only when the loop does)."""

    def close(self) -> None:
        """No threads, no KV transfer of its own."""

    # ---- finishing ------------------------------------------------------------------------
    def _finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq.sched)
        self.sequences.pop(seq.request_id, None)
        if reason in ("length", "stop"):
            self.num_completed += 1

    def _emit_token(self, seq: Sequence, token: int) -> EngineOutput:
        """The sampled `token`, as TensorRT-LLM gives it: its end id finishes the sequence but is neither output
        nor counted in its length (the samplers' "Do not increase seq len when EOS is generated", e.g.
        cpp/tensorrt_llm/kernels/samplingTopKKernels.cu; docs/twin.md), so the finishing output carries no token."""
        req = seq.request
        eos = req.end_id is not None and token == req.end_id
        if not eos:
            seq.output_token_ids.append(token)
        reason = None
        if eos or req.hits_stop_word(seq.output_token_ids):
            reason = "stop"
        elif len(seq.output_token_ids) >= req.max_new_tokens:
            reason = "length"
        out = EngineOutput(req.request_id, new_token_ids=[] if eos else [token],
                           sequence_length=seq.num_prompt_tokens + len(seq.output_token_ids),
                           finished=reason is not None, finish_reason=reason)
        if not seq.answered:
            seq.answered = True
            out.perf = dict(seq.perf)
        if reason is not None:
            self._finish(seq, reason)
        return out

    def abort(self, request_id: str) -> list[EngineOutput]:
        seq = self.sequences.get(request_id)
        if seq is None:
            return []
        self._finish(seq, "cancelled")
        return [EngineOutput(request_id, finished=True, finish_reason="cancelled")]

    def fail(self, seq: Sequence, message: str, kind: str = "internal") -> EngineOutput:
        self._finish(seq, "error")
        return EngineOutput(seq.request_id, finished=True, finish_reason="error", error=message, error_kind=kind)

    # ---- stepping -------------------------------------------------------------------------
    def _run(self, chunks: list[SeqChunk]) -> torch.Tensor:
        with torch.inference_mode():
            return self.model.forward(chunks, self.pool)

    def _decode_chunks(self, decode: tuple[SchedSequence, ...]) -> list[tuple[Sequence, SeqChunk]]:
        rows = []
        for sched in decode:
            seq = self.sequences[sched.request_id]
            rows.append((seq, SeqChunk([seq.output_token_ids[-1]], sched.num_tokens - 1, sched.block_table)))
        return rows

    def _forward_rows(self, chunks: list[SeqChunk]) -> list:
        return forward_each_on_failure(self._run, chunks, "sequences")

    def _emit_row(self, seq: Sequence, chunk: SeqChunk, result, stage: str) -> EngineOutput:
        """Samples and emits one row's token; a failure of its forward pass or its sampling fails it alone."""
        if isinstance(result, Exception):
            return self.fail(seq, f"request {seq.request_id}: {stage} failed: {type(result).__name__}: {result}")
        try:
            req = seq.request
            token = sample(result, req.sampling, chunk.end_pos, req.banned_tokens(seq.output_token_ids))
        except Exception as exc:
            return self.fail(seq, f"request {seq.request_id}: sampling failed: {type(exc).__name__}: {exc}")
        out = self._emit_token(seq, token)
        if req.return_generation_logits:
            out.generation_logits = logits_rows(result)
        return out

    def _step_rows(self, rows: list[tuple[Sequence, SeqChunk]], stage: str) -> list[EngineOutput]:
        results = self._forward_rows([c for _, c in rows])
        return [self._emit_row(seq, chunk, res, stage) for (seq, chunk), res in zip(rows, results)]

    def stats(self) -> dict[str, float]:
        return {"free_blocks": self.allocator.num_free_blocks, "used_blocks": self.allocator.num_used_blocks,
                "max_blocks": self.allocator.num_blocks, "tokens_per_block": self.config.tokens_per_block,
                "waiting": len(self.scheduler.waiting), "active": len(self.scheduler.running),
                "completed": self.num_completed}
