"""The colocated engine: one instance does both phases, TensorRT-LLM's in-flight fused batching.

Each step mixes the prefill of newly admitted prompts (whole prompts, within max_num_tokens) with
one decode token for every running sequence, so long prompts stall the decodes in their step;
this is the interference that disaggregation removes.
"""

from __future__ import annotations

from trtpd.engine.generation_engine import GenerationEngine
from trtpd.engine.model import SeqChunk
from trtpd.engine.request import EngineOutput, EngineRequest, RequestError, RequestType


class ColocatedEngine(GenerationEngine):
    prefill_in_step = True

    def validate(self, request: EngineRequest) -> None:
        if request.request_type is not RequestType.CONTEXT_AND_GENERATION:
            raise RequestError(f"request {request.request_id}: this is a colocated instance; send no request_type "
                               f"or context_and_generation (got {request.request_type.value})")
        self._check_lengths(request, len(request.prompt_token_ids))

    def add(self, request: EngineRequest) -> None:
        self._admit(request, len(request.prompt_token_ids))

    def has_work(self) -> bool:
        return self.scheduler.num_ready > 0 or self.scheduler.can_admit_next()

    def next_wakeup_s(self) -> float | None:
        return None

    def step(self) -> list[EngineOutput]:
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        now = self.clock()
        prefills = []
        for sched in plan.admitted:
            seq = self.sequences[sched.request_id]
            seq.perf["prefill_queue_s"] = now - seq.request.arrival_s
            prefills.append((seq, SeqChunk(seq.request.prompt_token_ids, 0, sched.block_table)))
        rows = prefills + self._decode_chunks(plan.decode)
        results = self._forward_rows([c for _, c in rows])
        compute_s = self.clock() - now
        for (seq, _), result in zip(prefills, results):
            seq.sched.is_ready = not isinstance(result, Exception)
            seq.perf["prefill_compute_s"] = compute_s
        return [self._emit_row(seq, chunk, result, "prefill" if i < len(prefills) else "decode step")
                for i, ((seq, chunk), result) in enumerate(zip(rows, results))]
