"""Roofline estimate of prefill and decode latency for one instance (TP devices).

time = max(FLOPs / (tp x peak x compute_efficiency), bytes per device / (HBM x hbm_efficiency))
       + TP all-reduce time + a fixed per-batch overhead.

FLOPs count the matmuls (2 x linear params per token; the LM head only in decode, since prefill
needs logits for the last token only) and attention: causal prefill 2 x layers x d_attn x sum(L^2),
decode 4 x layers x d_attn x sum(context), with d_attn = heads x head_size. Bytes per device: the
weight shard, plus the KV written (prefill) or read and written (decode). Each layer does two
all-reduces of tokens x hidden x 2 bytes; a ring moves 2 (tp - 1) / tp of that per device, over
NVLink inside a node and over the network beyond it.

MoE: FLOPs follow the active parameters (the experts each token picks); every parameter is resident
(the instance's devices hold all experts, split by TP or EP alike: the per-device share is the same),
and a step reads the weights of the experts its tokens hit: E x (1 - (1 - k/E)^n) per MoE layer for n
tokens (ModelSpec.expected_experts_touched), so a small decode batch reads about the active weights
and a large one (or any prefill) all of them. Communication stays the TP all-reduce model (EP's
all-to-alls move the same activations, k times over fewer hops; not modelled separately). MLA: the KV
read and written per token is the compressed latent (replicated on every TP rank), and attention
FLOPs use ModelSpec's prefill and decode attention widths.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpd.catalog import KvDtype, ModelSpec
from trtpd.errors import ConfigError
from trtpd.perf import step_runs
from trtpd.perf.hardware import HardwareProfile

ACTIVATION_BYTES = 2  # fp16/bf16 activations on the all-reduce
STEP_RUNS_KEPT = 4096  # RooflinePerfModel.decode_steps' and .chunk_steps' caches (a few hundred bytes each)
WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}


@dataclass(frozen=True)
class RooflineBreakdown:
    flops: float
    bytes_per_device: float
    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.comm_s + self.overhead_s

    @property
    def is_compute_bound(self) -> bool:
        return self.compute_s >= self.memory_s


def check_tp(model: ModelSpec, tp: int) -> None:
    if tp <= 0 or model.num_heads % tp:
        raise ConfigError(f"tp={tp}: must divide {model.name}'s {model.num_heads} attention heads")
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise ConfigError(f"tp={tp}: must divide {model.name}'s {model.num_kv_heads} KV heads or be a multiple of it")


class RooflinePerfModel:
    source = "roofline"

    def __init__(self, model: ModelSpec, hardware: HardwareProfile, tp: int = 1,
                 weight_dtype: str = "fp16", kv_dtype: KvDtype | str = KvDtype.FP16) -> None:
        check_tp(model, tp)
        if weight_dtype not in WEIGHT_BYTES:
            raise ConfigError(f"weight_dtype {weight_dtype!r}: use one of {', '.join(WEIGHT_BYTES)}")
        self.kv_dtype = KvDtype.parse(kv_dtype)
        if not hardware.supports_fp8 and "fp8" in (weight_dtype, self.kv_dtype.value):
            raise ConfigError(f"hardware {hardware.name!r} has no FP8 support; use fp16 weights and KV")
        self.model, self.hardware, self.tp, self.weight_dtype = model, hardware, tp, weight_dtype
        h = hardware
        embed = model.vocab_size * model.hidden_size
        lm_head = 0 if model.tie_word_embeddings else embed
        positions = model.num_position_embeddings * model.hidden_size
        self.linear_params_no_head = model.num_active_params - embed - lm_head - positions
        self.lm_head_params = embed
        self.d_attn = model.prefill_attention_dim
        self.d_attn_decode = model.decode_attention_dim
        self.flops_per_s = tp * h.flops_per_s(weight_dtype) * h.compute_efficiency
        self.hbm_bytes_per_s = h.hbm_bandwidth_bytes_per_s * h.hbm_efficiency
        wb = WEIGHT_BYTES[weight_dtype]
        self.weight_bytes_per_device = model.num_params * wb / tp
        # MoE: one routed expert's bytes per device, summed over the MoE layers; the rest is always read
        self.expert_bytes_per_device = model.num_moe_layers * model.expert_params * wb / tp
        self.always_read_bytes_per_device = self.weight_bytes_per_device - model.num_experts * self.expert_bytes_per_device
        self.kv_bytes_per_token_per_device = model.kv_bytes_per_token_per_device(tp, self.kv_dtype)
        within_node = tp <= h.max_devices_per_node and h.nvlink_bandwidth_bytes_per_s > 0
        link = h.nvlink_bandwidth_bytes_per_s if within_node else h.network_bandwidth_bytes_per_s
        self.allreduce_bytes_per_s = link * h.link_efficiency
        self._decode_runs: dict[int, step_runs.DecodeSteps] = {}
        self._chunk_runs: dict[tuple[int, int], step_runs.ChunkSteps] = {}
        self._init_decode_coeffs()

    # -- capacity --------------------------------------------------------------------------------
    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV one instance can hold after weights and the reserved share (0 if it does not fit)."""
        usable = self.hardware.memory_bytes * (1 - self.hardware.memory_reserved_fraction)
        free = usable - self.weight_bytes_per_device
        return max(0, int(free // self.kv_bytes_per_token_per_device))

    # -- latency ---------------------------------------------------------------------------------
    def weights_read_per_device(self, num_tokens: float) -> float:
        """Weight bytes one device reads for a pass over num_tokens tokens (all of them for a dense model)."""
        if not self.model.is_moe:
            return self.weight_bytes_per_device
        return (self.always_read_bytes_per_device
                + self.model.expected_experts_touched(num_tokens) * self.expert_bytes_per_device)

    def _comm_s(self, num_tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        size = num_tokens * self.model.hidden_size * ACTIVATION_BYTES
        per_allreduce = 2 * (self.tp - 1) / self.tp * size / self.allreduce_bytes_per_s + self.hardware.allreduce_latency_s
        return 2 * self.model.num_layers * per_allreduce

    def prefill_breakdown(self, num_tokens: int, sum_sq_tokens: int | None = None) -> RooflineBreakdown:
        """A batch of prompts packed without padding; sum_sq_tokens = sum of squared prompt lengths
        (defaults to one prompt of num_tokens)."""
        sq = num_tokens * num_tokens if sum_sq_tokens is None else sum_sq_tokens
        flops = 2 * self.linear_params_no_head * num_tokens + 2 * self.model.num_layers * self.d_attn * sq
        bytes_moved = self.weights_read_per_device(num_tokens) + num_tokens * self.kv_bytes_per_token_per_device
        return RooflineBreakdown(flops, bytes_moved, flops / self.flops_per_s, bytes_moved / self.hbm_bytes_per_s,
                                 self._comm_s(num_tokens), self.hardware.prefill_overhead_s)

    def decode_breakdown(self, batch_size: int, total_context_tokens: int) -> RooflineBreakdown:
        linear = self.linear_params_no_head + self.lm_head_params
        flops = 2 * linear * batch_size + 4 * self.model.num_layers * self.d_attn_decode * total_context_tokens
        bytes_moved = (self.weights_read_per_device(batch_size)
                       + (total_context_tokens + batch_size) * self.kv_bytes_per_token_per_device)
        return RooflineBreakdown(flops, bytes_moved, flops / self.flops_per_s, bytes_moved / self.hbm_bytes_per_s,
                                 self._comm_s(batch_size), self.hardware.decode_overhead_s)

    def mixed_breakdown(self, prefill_tokens: int, sum_sq_tokens: int, batch_size: int,
                        total_context_tokens: int) -> RooflineBreakdown:
        """A colocated step: new prompts and running sequences in one pass, weights read once."""
        p = self.prefill_breakdown(prefill_tokens, sum_sq_tokens)
        d = self.decode_breakdown(batch_size, total_context_tokens)
        bytes_moved = (p.bytes_per_device + d.bytes_per_device - self.weights_read_per_device(prefill_tokens)
                       - self.weights_read_per_device(batch_size) + self.weights_read_per_device(prefill_tokens + batch_size))
        return RooflineBreakdown(p.flops + d.flops, bytes_moved, p.compute_s + d.compute_s,
                                 bytes_moved / self.hbm_bytes_per_s, self._comm_s(prefill_tokens + batch_size),
                                 max(p.overhead_s, d.overhead_s))

    def mixed_step_s(self, prefill_tokens: int, sum_sq_tokens: int, batch_size: int,
                     total_context_tokens: int) -> float:
        """Same as mixed_breakdown(...).total_s, inlined (the same operations in the same order, no breakdown
        objects): the simulator's colocated instances call it once per step."""
        if not prefill_tokens:
            return self.decode_step_s(batch_size, total_context_tokens)
        (c_prefill_linear, c_prefill_attn, c_decode_linear, c_decode_attn, ring, latency_s, two_layers,
         overhead_s) = self._mixed_coeffs
        flops_per_s, kv = self.flops_per_s, self.kv_bytes_per_token_per_device
        p_flops = c_prefill_linear * prefill_tokens + c_prefill_attn * sum_sq_tokens
        d_flops = c_decode_linear * batch_size + c_decode_attn * total_context_tokens
        if self.model.is_moe:
            w_p = self.weights_read_per_device(prefill_tokens)
            w_d = self.weights_read_per_device(batch_size)
            w_pd = self.weights_read_per_device(prefill_tokens + batch_size)
        else:
            w_p = w_d = w_pd = self.weight_bytes_per_device
        bytes_moved = (w_p + prefill_tokens * kv) + (w_d + (total_context_tokens + batch_size) * kv) - w_p - w_d + w_pd
        compute_s = p_flops / flops_per_s + d_flops / flops_per_s
        memory_s = bytes_moved / self.hbm_bytes_per_s
        if ring is None:
            comm_s = 0.0
        else:      # as _comm_s(prefill_tokens + batch_size)
            comm_s = two_layers * (ring * ((prefill_tokens + batch_size) * self.model.hidden_size * ACTIVATION_BYTES)
                                   / self.allreduce_bytes_per_s + latency_s)
        return (compute_s if compute_s >= memory_s else memory_s) + comm_s + overhead_s

    def prefill_s(self, num_tokens: int, sum_sq_tokens: int | None = None) -> float:
        return self.prefill_breakdown(num_tokens, sum_sq_tokens).total_s

    def decode_step_s(self, batch_size: int, total_context_tokens: int) -> float:
        """Same as decode_breakdown(...).total_s, inlined: the simulator calls it once per step."""
        c_batch, c_context, mem_weights, mem_kv, comm_batch, comm_fixed, overhead = self._decode_coeffs
        compute = c_batch * batch_size + c_context * total_context_tokens
        memory = mem_weights + mem_kv * (total_context_tokens + batch_size)
        if self._mem_expert:
            memory += self._mem_expert * self.model.expected_experts_touched(batch_size)
        return (compute if compute > memory else memory) + comm_batch * batch_size + comm_fixed + overhead

    def decode_steps(self, batch_size: int) -> step_runs.DecodeSteps:
        """trtpd.perf.step_runs.decode_steps at batch_size, with decode_step_s's arithmetic inlined and the terms
        of the batch alone computed once (the same operations, so the same floats). Kept for the next call
        with the same batch (STEP_RUNS_KEPT calls)."""
        run = self._decode_runs.get(batch_size)
        if run is not None:
            return run
        if self._mem_expert:
            decode_step_s = self.decode_step_s
            run = step_runs.decode_steps(lambda context: decode_step_s(batch_size, context), batch_size)
        else:
            c_batch, c_context, mem_weights, mem_kv, comm_batch, comm_fixed, overhead = self._decode_coeffs
            compute_batch = c_batch * batch_size
            comm_batch_s = comm_batch * batch_size

            def run(context: int, end_s: float, busy_s: float, until_s: float,
                    max_steps: int) -> tuple[int, int, float, float]:
                n = 0
                while n < max_steps and end_s < until_s:
                    context += batch_size
                    compute = compute_batch + c_context * context
                    memory = mem_weights + mem_kv * (context + batch_size)
                    duration_s = (compute if compute > memory else memory) + comm_batch_s + comm_fixed + overhead
                    busy_s += duration_s
                    end_s += duration_s
                    n += 1
                return n, context, end_s, busy_s
        return _kept(self._decode_runs, batch_size, run)

    def chunk_steps(self, chunk_tokens: int, batch_size: int) -> step_runs.ChunkSteps:
        """trtpd.perf.step_runs.chunk_steps at (chunk_tokens, batch_size), with mixed_step_s's arithmetic inlined
        and the terms that depend on neither the chunk's offset nor the context computed once (the same
        operations, so the same floats). Kept like decode_steps'."""
        key = (chunk_tokens, batch_size)
        run = self._chunk_runs.get(key)
        if run is not None:
            return run
        if self.model.is_moe:
            mixed_step_s = self.mixed_step_s
            run = step_runs.chunk_steps(lambda sum_sq, context: mixed_step_s(chunk_tokens, sum_sq, batch_size, context),
                                        chunk_tokens, batch_size)
            return _kept(self._chunk_runs, key, run)
        (c_prefill_linear, c_prefill_attn, c_decode_linear, c_decode_attn, ring, latency_s, two_layers,
         overhead_s) = self._mixed_coeffs
        flops_per_s, kv, hbm_bytes_per_s = self.flops_per_s, self.kv_bytes_per_token_per_device, self.hbm_bytes_per_s
        p_linear_flops = c_prefill_linear * chunk_tokens
        d_linear_flops = c_decode_linear * batch_size
        w = self.weight_bytes_per_device
        p_bytes = w + chunk_tokens * kv
        comm_s = 0.0 if ring is None else two_layers * (
            ring * ((chunk_tokens + batch_size) * self.model.hidden_size * ACTIVATION_BYTES)
            / self.allreduce_bytes_per_s + latency_s)
        chunk_sq, two_chunk = chunk_tokens * chunk_tokens, 2 * chunk_tokens

        def run(done: int, context: int, now_s: float, busy_s: float, until_s: float,
                max_steps: int) -> tuple[int, int, int, float, float]:
            n, end_s = 0, now_s
            while True:
                p_flops = p_linear_flops + c_prefill_attn * (chunk_sq + two_chunk * done)
                d_flops = d_linear_flops + c_decode_attn * context
                bytes_moved = p_bytes + (w + (context + batch_size) * kv) - w - w + w
                compute_s = p_flops / flops_per_s + d_flops / flops_per_s
                memory_s = bytes_moved / hbm_bytes_per_s
                duration_s = (compute_s if compute_s >= memory_s else memory_s) + comm_s + overhead_s
                busy_s += duration_s
                end_s += duration_s
                if n >= max_steps or not end_s < until_s:
                    return n, done, context, end_s, busy_s
                n += 1
                context += batch_size
                done += chunk_tokens
        return _kept(self._chunk_runs, key, run)

    def _init_decode_coeffs(self) -> None:
        layers = self.model.num_layers
        h = self.hardware
        # mixed_step_s: the leading products of prefill_breakdown's, decode_breakdown's and _comm_s's terms
        # (Python multiplies left to right, so 2 * a * n is (2 * a) * n: the same floats)
        self._mixed_coeffs = (2 * self.linear_params_no_head, 2 * layers * self.d_attn,
                              2 * (self.linear_params_no_head + self.lm_head_params), 4 * layers * self.d_attn_decode,
                              2 * (self.tp - 1) / self.tp if self.tp > 1 else None, h.allreduce_latency_s,
                              2 * layers, max(h.prefill_overhead_s, h.decode_overhead_s))
        linear = self.linear_params_no_head + self.lm_head_params
        if self.tp > 1:
            ring = 2 * (self.tp - 1) / self.tp * self.model.hidden_size * ACTIVATION_BYTES / self.allreduce_bytes_per_s
            comm = (2 * layers * ring, 2 * layers * self.hardware.allreduce_latency_s)
        else:
            comm = (0.0, 0.0)
        moe = self.model.is_moe
        self._mem_expert = self.expert_bytes_per_device / self.hbm_bytes_per_s if moe else 0.0
        self._decode_coeffs = (2 * linear / self.flops_per_s, 4 * layers * self.d_attn_decode / self.flops_per_s,
                               (self.always_read_bytes_per_device if moe else self.weight_bytes_per_device)
                               / self.hbm_bytes_per_s,
                               self.kv_bytes_per_token_per_device / self.hbm_bytes_per_s,
                               *comm, self.hardware.decode_overhead_s)


def _kept(cache: dict, key, value):
    """value, kept in cache under key (cleared when full: STEP_RUNS_KEPT)."""
    if len(cache) >= STEP_RUNS_KEPT:
        cache.clear()
    cache[key] = value
    return value
