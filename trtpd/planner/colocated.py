"""Colocated configurations for the planner: the same engines doing both phases, as people run them.

A colocated candidate is a TP degree (its decode candidate's KV pool and batch cap), a step policy
(trtpd.sim.colocated_instance: TensorRT-LLM in-flight batching, with or without chunked context; vLLM
0.2's prefill-first for comparisons) and a token budget per step.

Static estimate (no queueing): at rate lambda per instance a mean step of s seconds carries
b = lambda x (L_out - 1) x s decode rows and c = lambda x L_in x s prompt tokens; s solves
s = mixed_step(c, b) for chunked context (prompt tokens spread over the steps, within the budget);
in-flight batching without chunking takes prompts whole, so with lambda x s < 1 only that share of the
steps carries one (s = lambda s mixed_step(L_in, b) + (1 - lambda s) decode_step(b)); prefill_first:
decode steps stretched by the prefill share of time. TPOT = s;
TTFT = the p-quantile prompt's own steps (chunked: ceil(L_p / (budget - b)) steps). The highest lambda
meeting both SLOs, with b under the batch cap and b + c under the budget, is the static rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtpd.perf.model import InstancePerf
from trtpd.planner.candidates import DecodeCandidate
from trtpd.planner.estimate import bisect_max
from trtpd.planner.inputs import Slo
from trtpd.planner.role_models import WorkloadStats
from trtpd.sched.continuous import BatchSchedulerConfig
from trtpd.sim.cluster import BatchRole, ClusterSpec
from trtpd.sim.colocated_instance import mixed_step_s

CHUNK_BUDGETS_TOKENS = (512, 1024, 2048, 4096, 8192)   # TensorRT-LLM's max_num_tokens default is 8192


@dataclass(frozen=True)
class ColocatedCandidate:
    tp: int
    policy: str                  # inflight | chunked | prefill_first
    inst: InstancePerf
    max_batch_size: int
    max_num_tokens: int          # token budget per step (decode rows included)

    @property
    def label(self) -> str:
        return f"TP{self.tp} {self.policy} ({self.max_num_tokens}-token steps, batch {self.max_batch_size})"

    def cluster(self, num_instances: int, tokens_per_block: int) -> ClusterSpec:
        sched = BatchSchedulerConfig(max_batch_size=self.max_batch_size,
                                     max_num_tokens=max(self.max_num_tokens, self.max_batch_size), prefill_in_step=True)
        return ClusterSpec(mode="colocated", decode=BatchRole(num_instances, self.inst.perf, self.inst.kv_capacity_tokens,
                                                              sched),
                           tokens_per_block=tokens_per_block, response_latency_s=self.inst.response_latency_s,
                           colocated_policy=self.policy, shared_cores=self.inst.shared_cores)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StaticPoint:
    rate_per_s: float            # per instance
    step_s: float                # = TPOT
    ttft_s: float
    batch: float


def candidates_for(decode: DecodeCandidate, max_input_len: int,
                   policies: tuple[str, ...] = ("inflight", "chunked"),
                   inst: InstancePerf | None = None) -> list[ColocatedCandidate]:
    """inflight with room for the longest prompt next to a full batch; chunked at each budget. `inst`: the
    instance's performance as a colocated one (its serving path, where the profile measured one; default: the
    decode candidate's)."""
    inst = inst or decode.inst
    out = []
    for policy in policies:
        if policy == "chunked":
            out += [ColocatedCandidate(decode.tp, policy, inst, decode.max_batch_size, b)
                    for b in CHUNK_BUDGETS_TOKENS]
        else:
            out.append(ColocatedCandidate(decode.tp, policy, inst, decode.max_batch_size,
                                          max_input_len + decode.max_batch_size))
    return out


StepMemo = dict[tuple[int, int, int, int], float]   # mixed_step_s by its arguments, for one performance model


def _mixed_step_s(perf, memo: StepMemo | None):
    """mixed_step_s on perf, remembering each result in memo (a pure function of its arguments: the fixed
    points of nearby rates and of one TP's candidates pass through the same steps)."""
    if memo is None:
        return lambda *args: mixed_step_s(perf, *args)

    def step_s(*args: int) -> float:
        value = memo.get(args)
        if value is None:
            value = memo[args] = mixed_step_s(perf, *args)
        return value
    return step_s


def static_point(c: ColocatedCandidate, stats: WorkloadStats, rate_per_s: float, p: float,
                 memo: StepMemo | None = None) -> StaticPoint | None:
    """The steady state at rate_per_s per instance without queueing; None when it does not exist.
    memo: mixed step times of c's performance model already computed (filled in)."""
    perf = c.inst.perf
    mixed = _mixed_step_s(perf, memo)
    l_in, steps = stats.input.mean, max(stats.output.mean - 1, 1e-9)
    sq_per_token = stats.input.mean_sq / l_in
    ctx = l_in + stats.output.mean / 2
    budget = c.max_num_tokens
    prefill_per_token_s = perf.prefill_s(budget, int(budget * sq_per_token)) / budget
    s = perf.decode_step_s(1, int(ctx))
    b = 0.0
    for _ in range(100):
        b = rate_per_s * steps * s
        tokens = rate_per_s * l_in * s
        if b > c.max_batch_size or (c.policy != "prefill_first" and b + tokens > budget):
            return None
        batch, context = max(1, round(b)), int(max(b, 1) * ctx)
        if c.policy == "prefill_first":
            share = rate_per_s * l_in * prefill_per_token_s
            if share >= 1:
                return None
            nxt = perf.decode_step_s(batch, context) / (1 - share)
        elif c.policy == "inflight" and rate_per_s * s < 1:
            # whole prompts: only the share lambda s of the steps carries one, the rest only decode (at lambda s
            # >= 1 every step carries prompts, as spread below)
            if b + l_in > budget:
                return None
            share = rate_per_s * s
            nxt = share * mixed(int(l_in), int(l_in * sq_per_token), batch, context) \
                + (1 - share) * perf.decode_step_s(batch, context)
        else:
            nxt = mixed(int(tokens), int(tokens * sq_per_token), batch, context)
        if abs(nxt - s) < 1e-6 * s:
            s = nxt
            break
        s = nxt
    l_p = stats.input.quantile(p)
    if c.policy == "chunked":
        room = budget - b
        ttft = math.ceil(l_p / room) * s if room >= 1 else math.inf
    elif c.policy == "inflight":
        ttft = mixed(int(l_p), int(l_p * l_p), max(1, round(b)), int(max(b, 1) * ctx))
    else:
        ttft = perf.prefill_s(int(l_p), int(l_p * l_p))
    return StaticPoint(rate_per_s, s, ttft, b)


def static_rate_per_s(c: ColocatedCandidate, stats: WorkloadStats, slo: Slo, memo: StepMemo | None = None) -> float:
    """The highest rate per instance whose static steady state meets both SLOs. memo: as static_point's
    (one for the candidates that share a performance model)."""
    def ok(rate: float) -> bool:
        pt = static_point(c, stats, rate, slo.attainment, memo)
        return pt is not None and pt.step_s <= slo.tpot_s and pt.ttft_s <= slo.ttft_s
    l_in = stats.input.mean
    hi = c.max_num_tokens / (c.inst.perf.prefill_s(c.max_num_tokens) * l_in) + 1.0
    return bisect_max(ok, hi)
