"""The prefill (context-only) engine: batches prompts, computes their KV, hands it to the exporter.

One step: free blocks the exporter released, let the prefill scheduler pick a batch (length buckets,
bucket timeout, min batch, cross-bucket fill), register each request with the exporter (its handle
goes out at once, so decode can start pulling while we compute), run the forward pass marking each
layer ready as it is written, sample the first tokens and complete the exports. Blocks stay held
until decode has pulled them or the transfer times out. A first token that ends the request (its end id,
a stop word) ends it here, as in TensorRT-LLM: its export is discarded and its answer carries no handle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trtpd.engine.engine_config import EngineConfig
from trtpd.engine.model import LlamaModel, SeqChunk
from trtpd.engine.protocol import EngineHooks
from trtpd.engine.request import (EngineOutput, EngineRequest, RequestError, RequestType, check_tokens,
                                  forward_each_on_failure, logits_rows)
from trtpd.engine.sampler import sample
from trtpd.kv.errors import KvExportNotFoundError
from trtpd.kv.export_table import ExportAbandoned
from trtpd.kv.pool import KvPool
from trtpd.sched.block_allocator import BlockAllocator
from trtpd.sched.prefill import PrefillRequest, PrefillScheduler, PrefillSchedulerConfig


@dataclass
class _Pending:
    request: EngineRequest
    block_ids: list[int] | None = None


class PrefillEngine:
    def __init__(self, config: EngineConfig, model: LlamaModel, pool: KvPool, exporter,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.model = model
        self.pool = pool
        self.exporter = exporter
        self.clock = clock
        self.allocator = BlockAllocator(pool.num_blocks, config.tokens_per_block)
        self.scheduler = PrefillScheduler(PrefillSchedulerConfig(
            bucket_boundaries_tokens=tuple(config.bucket_boundaries_tokens),
            bucket_timeout_s=config.bucket_timeout_ms / 1000.0, min_batch_size=config.min_batch_size,
            max_batch_size=config.max_batch_size, max_num_tokens=config.max_num_tokens))
        self.waiting: dict[str, _Pending] = {}
        self.held_blocks: dict[str, list[int]] = {}   # exported, not yet released
        self.num_completed = 0
        # The engine loop's (bind): delivers outputs at once, so the layer-wise handles go out before
        # the forward pass (returned from step() they would wait for the whole batch to compute).
        self.emit: Callable[[list[EngineOutput]], None] | None = None

    def bind(self, hooks: EngineHooks) -> None:
        self.emit = hooks.emit
        self.exporter.wakeup = hooks.wakeup      # a released export frees blocks: step again

    def close(self) -> None:
        self.exporter.close()

    # ---- requests -------------------------------------------------------------------------
    def validate(self, request: EngineRequest) -> None:
        if request.request_type is not RequestType.CONTEXT_ONLY:
            raise RequestError(f"request {request.request_id}: this is a prefill (context-only) instance; send "
                               f"request_type=context_only (got {request.request_type.value})")
        n = len(request.prompt_token_ids)
        if n == 0:
            raise RequestError(f"request {request.request_id}: empty prompt (input_lengths 0)")
        if n > self.config.max_input_len:
            raise RequestError(f"request {request.request_id}: prompt has {n} tokens, above this engine's "
                               f"max_input_len {self.config.max_input_len}; shorten the prompt")
        if n + request.max_new_tokens > self.config.max_seq_len:   # decode would refuse it after our work
            raise RequestError(f"request {request.request_id}: prompt ({n}) + request_output_len "
                               f"({request.max_new_tokens}) exceeds max_seq_len {self.config.max_seq_len}; "
                               f"ask for at most {self.config.max_seq_len - n} tokens")
        check_tokens(request, self.model.spec.vocab_size)

    def add(self, request: EngineRequest) -> None:
        self.waiting[request.request_id] = _Pending(request)
        self.scheduler.add(PrefillRequest(request.request_id, len(request.prompt_token_ids), request.arrival_s))

    def abort(self, request_id: str) -> list[EngineOutput]:
        if request_id in self.waiting and self.scheduler.remove(request_id):
            del self.waiting[request_id]
            return [EngineOutput(request_id, finished=True, finish_reason="cancelled")]
        if request_id in self.held_blocks:
            self.exporter.fail(request_id, "cancelled by the client")
        return []

    # ---- stepping -------------------------------------------------------------------------
    def _release(self) -> None:
        for request_id in self.exporter.drain_released():
            blocks = self.held_blocks.pop(request_id, None)
            if blocks is not None:
                self.allocator.free(blocks)

    def has_work(self) -> bool:
        """Nothing to do before the next bucket deadline or a new request (the loop sleeps until then)."""
        return False

    def next_wakeup_s(self) -> float | None:
        return self.scheduler.next_deadline_s()

    def step(self) -> list[EngineOutput]:
        self._release()
        now = self.clock()
        free_tokens = (self.allocator.num_free_blocks - self.config.max_batch_size) * self.config.tokens_per_block
        batch = self.scheduler.schedule(now, max_tokens_available=max(0, free_tokens))
        if batch is None:
            return []
        outputs: list[EngineOutput] = []
        pending: list[_Pending] = []
        for req in batch.requests:
            item = self.waiting.pop(req.request_id)
            try:
                handle = self._start_export(item, req.num_tokens)
            except ExportAbandoned:   # its client left before it was scheduled: no compute, no KV
                outputs.append(EngineOutput(req.request_id, finished=True, finish_reason="cancelled"))
                continue
            except Exception as exc:
                outputs.append(self._error(item, f"KV export could not start: {type(exc).__name__}: {exc}"))
                continue
            if item.request.layerwise_kv_transfer:   # the request is answered; the KV follows layer by layer
                outputs.append(EngineOutput(req.request_id, finished=True, context_phase_params=handle,
                                            perf={"prefill_queue_s": now - item.request.arrival_s}))
            pending.append(item)
        if self.emit is not None and outputs:
            self.emit(outputs)
            outputs = []
        started = self.clock()
        results = self._forward(pending)
        perf = {"prefill_compute_s": self.clock() - started, "prefill_batch_size": float(len(pending)),
                "prefill_batch_tokens": float(batch.num_tokens)}
        outputs += [self._complete(item, result, started, perf) for item, result in zip(pending, results)]
        self._release()   # the batch is computed: what it released (a request ended at its first token) is free now
        return outputs

    def _start_export(self, item: _Pending, num_tokens: int) -> bytes:
        """Blocks for the prompt and a registered export (its handle); on failure nothing stays held."""
        request_id = item.request.request_id
        item.block_ids = self.allocator.allocate(self.allocator.blocks_for(num_tokens))
        try:
            handle = self.exporter.register(request_id, item.block_ids, num_tokens)
        except Exception:
            self.allocator.free(item.block_ids)
            raise
        self.held_blocks[request_id] = item.block_ids
        return handle

    def _run(self, items: list[_Pending]) -> torch.Tensor:
        ids = [item.request.request_id for item in items]
        chunks = [SeqChunk(item.request.prompt_token_ids, 0, item.block_ids) for item in items]
        with torch.inference_mode():
            return self.model.forward(chunks, self.pool,
                                      on_layer_done=lambda layer: self.exporter.mark_layers_ready(ids, layer))

    def _forward(self, items: list[_Pending]) -> list:
        return forward_each_on_failure(self._run, items, "prefill requests")

    def _error(self, item: _Pending, message: str, kind: str = "internal") -> EngineOutput:
        """Fails one request: its export (if any) is failed, so decode hears the cause and its blocks return."""
        request_id = item.request.request_id
        message = f"request {request_id}: {message}"
        if request_id in self.held_blocks:
            self.exporter.fail(request_id, message)
        return EngineOutput(request_id, finished=True, finish_reason="error", error=message, error_kind=kind)

    def _complete(self, item: _Pending, result, started: float, perf: dict[str, float]) -> EngineOutput:
        req = item.request
        if isinstance(result, Exception):
            return self._error(item, f"prefill failed: {type(result).__name__}: {result}")
        try:
            token = sample(result, req.sampling, len(req.prompt_token_ids), req.banned_tokens([]))
        except Exception as exc:
            return self._error(item, f"sampling failed: {type(exc).__name__}: {exc}")
        eos = token == req.end_id     # not output, not counted (TensorRT-LLM's samplers; generation_engine.py)
        stop = eos or req.hits_stop_word([token])
        out = EngineOutput(
            req.request_id, new_token_ids=[] if eos else [token], sequence_length=len(req.prompt_token_ids) + 1 - eos,
            finished=True, finish_reason="stop" if stop else "length" if req.max_new_tokens <= 1 else None,
            perf={"prefill_queue_s": started - req.arrival_s, **perf},
            generation_logits=logits_rows(result) if req.return_generation_logits else None)
        if stop and not req.layerwise_kv_transfer:
            # The first token ended the request, as TensorRT-LLM's executor ends it: the decoder finishes it (END_ID,
            # or its stop criteria), updateRequests (batch_manager/trtGptModelInflightBatching.cpp) terminates it and
            # frees its KV; forwardSync sends a context-only request's KV only when its context finished without
            # ending it (isContextFinished), and llmRequest.cpp createResult gives context phase params only then.
            # So no KV is kept and no handle given (the role model then answers as the backend does,
            # error_kinds.CONTEXT_PARAMS_MISSING). The layerwise transfer's handle went out already: decode ends it.
            self.exporter.discard(req.request_id, "the request ended at its first token")
            self.num_completed += 1
            return out
        try:
            out.context_phase_params = self.exporter.complete(req.request_id, token)
        except KvExportNotFoundError as exc:   # timed out or cancelled while the batch ran
            return EngineOutput(req.request_id, finished=True, finish_reason="error", error=str(exc),
                                error_kind="unavailable")
        self.num_completed += 1
        return out

    def stats(self) -> dict[str, float]:
        return {"free_blocks": self.allocator.num_free_blocks, "used_blocks": self.allocator.num_used_blocks,
                "max_blocks": self.allocator.num_blocks, "tokens_per_block": self.config.tokens_per_block,
                "waiting": self.scheduler.num_waiting, "active": len(self.held_blocks),
                "completed": self.num_completed}
