"""The decode (generation-only) engine: pulls each request's KV from prefill, then decodes.

A generation-only request carries the prefill side's signed `context_phase_params`. `validate`
checks signature, expiry and KV layout before anything is allocated. Admission reserves the
sequence's blocks (GUARANTEED_NO_EVICT) and starts the pull on a worker thread, layer by layer;
when the KV and the first token are in, the sequence joins the continuous batch. Responses start
with the first token (computed by prefill), as TensorRT-LLM's generation-only responses do.
A request cancelled while it waits for admission gives its handle up (KvImporter.give_up, on a thread
of its own), so prefill frees those blocks now rather than at the export's deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from trtpd.engine.engine_config import EngineConfig
from trtpd.engine.generation_engine import GenerationEngine, Sequence
from trtpd.engine.model import LlamaModel
from trtpd.engine.protocol import EngineHooks
from trtpd.engine.request import EngineOutput, EngineRequest, RequestError, RequestType
from trtpd.kv.pool import KvPool

log = logging.getLogger(__name__)


class DecodeEngine(GenerationEngine):
    prefill_in_step = False

    def __init__(self, config: EngineConfig, model: LlamaModel, pool: KvPool, importer,
                 clock: Callable[[], float] = time.monotonic, num_pull_threads: int = 4,
                 wakeup: Callable[[], None] | None = None) -> None:
        super().__init__(config, model, pool, clock)
        self.importer = importer
        self.wakeup = wakeup or (lambda: None)
        self.pulls = ThreadPoolExecutor(max_workers=num_pull_threads, thread_name_prefix="kv-pull")
        self.give_ups = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-give-up")
        self.transfers: dict[str, Future] = {}
        self.params: dict[str, object] = {}
        self.cancelled_transfers: set[str] = set()

    def validate(self, request: EngineRequest) -> None:
        if request.request_type is not RequestType.GENERATION_ONLY:
            raise RequestError(f"request {request.request_id}: this is a decode (generation-only) instance; send "
                               f"request_type=generation_only with the prefill's context_phase_params "
                               f"(got {request.request_type.value})")
        if not request.context_phase_params:
            raise RequestError(f"request {request.request_id}: generation_only needs the context_phase_params "
                               f"tensor returned by the prefill instance")
        params = self.importer.verify(request.context_phase_params, time.time())   # raises KvTransferError
        self._check_lengths(request, params.num_tokens)
        if request.prompt_token_ids and len(request.prompt_token_ids) != params.num_tokens:
            raise RequestError(f"request {request.request_id}: input_lengths {len(request.prompt_token_ids)} differs "
                               f"from the {params.num_tokens} tokens prefill computed; send the same prompt")
        self.params[request.request_id] = params

    def add(self, request: EngineRequest) -> None:
        params = self.params[request.request_id]
        self._admit(request, params.num_tokens)

    def has_work(self) -> bool:
        return (self.scheduler.num_ready > 0 or self.scheduler.can_admit_next()
                or any(f.done() for f in self.transfers.values()))

    def next_wakeup_s(self) -> float | None:
        return None

    def abort(self, request_id: str) -> list[EngineOutput]:
        if request_id in self.transfers:   # the pull thread still writes into its blocks: free them later
            self.cancelled_transfers.add(request_id)
            return [EngineOutput(request_id, finished=True, finish_reason="cancelled")]
        params = self.params.pop(request_id, None)
        if params is not None and request_id in self.sequences:   # admitted, never pulled: prefill can free it
            self.give_ups.submit(self._give_up, params)
        return super().abort(request_id)

    def _give_up(self, params) -> None:
        try:
            self.importer.give_up(params)
        except Exception as exc:   # noqa: BLE001 - best effort: the export's deadline frees it anyway
            log.info("could not give up the KV of %s (%s); prefill frees it at its deadline", params.request_id, exc)

    def _start_pull(self, seq: Sequence) -> None:
        params = self.params.pop(seq.request_id)
        seq.perf["decode_queue_s"] = self.clock() - seq.request.arrival_s
        future = self.pulls.submit(self.importer.pull, params, list(seq.sched.block_table))
        future.add_done_callback(lambda _: self.wakeup())
        self.transfers[seq.request_id] = future

    def _collect_pulls(self) -> list[EngineOutput]:
        outputs = []
        for request_id, future in list(self.transfers.items()):
            if not future.done():
                continue
            del self.transfers[request_id]
            seq = self.sequences[request_id]
            if request_id in self.cancelled_transfers:
                self.cancelled_transfers.discard(request_id)
                self._finish(seq, "cancelled")
                continue
            exc = future.exception()
            if exc is not None:
                outputs.append(self.fail(seq, f"KV transfer failed: {exc}", kind="unavailable"))
                continue
            result = future.result()
            moved_s = sum(result.layer_move_s)
            seq.perf["kv_transfer_s"] = moved_s   # moving bytes; waiting for layers is prefill compute
            seq.perf["prefill_compute_s"] = max(0.0, result.seconds - moved_s)
            seq.perf["kv_bytes"] = float(result.bytes_moved)
            seq.sched.is_ready = True
            outputs.append(self._emit_token(seq, result.first_token))
        return outputs

    def step(self) -> list[EngineOutput]:
        outputs = self._collect_pulls()
        plan = self.scheduler.schedule()
        for sched in plan.admitted:
            self._start_pull(self.sequences[sched.request_id])
        if not plan.decode:
            return outputs
        return outputs + self._step_rows(self._decode_chunks(plan.decode), "decode step")

    def bind(self, hooks: EngineHooks) -> None:
        self.wakeup = hooks.wakeup               # a KV pull finished: its sequence can decode

    def close(self) -> None:
        self.pulls.shutdown(wait=True, cancel_futures=True)
        self.give_ups.shutdown(wait=True, cancel_futures=True)
        self.importer.close()
