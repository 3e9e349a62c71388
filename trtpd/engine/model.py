"""The reference decoder: Llama architecture (RMSNorm, RoPE, GQA, SwiGLU) over a paged KV cache.

Batch invariance (greedy output through the disaggregated path equals the colocated path bit for
bit) is built in, not hoped for; the recipe and why it holds on any x86-64 CPU are in row_tiles.py:
- every row-wise computation (norms, the fused QKV projection, the output projection and MLP, the
  LM head) runs on tiles of exactly TILE_ROWS rows, one thread per process;
- attention runs per sequence, on K/V read back from the cache (so prefill attention sees exactly
  the cache-dtype values that decode will see);
- RoPE and residual adds are elementwise.
`LlamaModel.check_batch_invariance` verifies it on the running machine; the loader refuses to load
an engine for which it fails.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtpd.catalog import KvDtype, ModelSpec
from trtpd.engine.row_tiles import (BatchInvarianceReport, Linear, check_batch_invariance, concat_weights,
                                    default_linear, pad_rows, padded_rows, rms_norm, tile_map)
from trtpd.engine.step_trace import host_cpu_s
from trtpd.kv.pool import KvPool

FP8_MAX = 448.0


@dataclass
class SeqChunk:
    """One sequence's rows in a forward pass: `token_ids` at positions start_pos.. start_pos+n-1."""

    token_ids: list[int]
    start_pos: int
    block_table: list[int]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)


class LlamaModel:
    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor],
                 k_scales: Sequence[float], v_scales: Sequence[float], linear: Linear = default_linear) -> None:
        self.spec = spec
        self.w = weights
        self.k_scales = [float(s) for s in k_scales]
        self.v_scales = [float(s) for s in v_scales]
        self.linear = linear
        self.trace = None   # a StepTrace (trtpd/engine/step_trace.py) when the process traces its passes
        half = spec.head_size // 2
        inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, half, dtype=torch.float64) / half))
        angles = torch.outer(torch.arange(spec.max_position_embeddings, dtype=torch.float64), inv_freq)
        self.cos = torch.cos(angles).float()
        self.sin = torch.sin(angles).float()
        # fused projections: fewer tile calls, the same rows
        self.qkv_w = [concat_weights(weights[f"model.layers.{i}.self_attn.{n}_proj.weight"] for n in "qkv")
                      for i in range(spec.num_layers)]
        self.gate_up_w = [concat_weights(weights[f"model.layers.{i}.mlp.{n}_proj.weight"] for n in ("gate", "up"))
                          for i in range(spec.num_layers)]

    # ---- the row-wise blocks, each called on one TILE_ROWS-row tile ----------------------
    def _qkv_rows(self, i: int) -> Callable[[torch.Tensor], torch.Tensor]:
        norm_w = self.w[f"model.layers.{i}.input_layernorm.weight"]
        eps = self.spec.rms_norm_eps
        return lambda h: self.linear(rms_norm(h, norm_w, eps), self.qkv_w[i])

    def _mlp_rows(self, i: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        p, eps, inter = f"model.layers.{i}.", self.spec.rms_norm_eps, self.spec.intermediate_size
        o_w, norm_w, down_w = (self.w[p + "self_attn.o_proj.weight"], self.w[p + "post_attention_layernorm.weight"],
                               self.w[p + "mlp.down_proj.weight"])

        def rows(h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
            h = h + self.linear(attn, o_w)
            gate_up = self.linear(rms_norm(h, norm_w, eps), self.gate_up_w[i])
            return h + self.linear(F.silu(gate_up[:, :inter]) * gate_up[:, inter:], down_w)
        return rows

    def _head_rows(self) -> Callable[[torch.Tensor], torch.Tensor]:
        norm_w, head_w, eps = self.w["model.norm.weight"], self.w["lm_head.weight"], self.spec.rms_norm_eps
        return lambda h: self.linear(rms_norm(h, norm_w, eps), head_w)

    def _split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spec, d = self.spec, self.spec.head_size
        nq, nkv = spec.num_heads * d, spec.num_kv_heads * d
        return (qkv[:, :nq].reshape(-1, spec.num_heads, d), qkv[:, nq:nq + nkv].reshape(-1, spec.num_kv_heads, d),
                qkv[:, nq + nkv:].reshape(-1, spec.num_kv_heads, d))

    def check_batch_invariance(self, max_rows: int) -> BatchInvarianceReport:
        """Verifies on this machine, for every forward-pass size up to `max_rows`, that each row-wise
        block gives every row the result it has alone (layer 0's blocks and the LM head: all layers
        have the same shapes, and kernels are chosen by shape)."""
        h, q = self.spec.hidden_size, self.spec.num_heads * self.spec.head_size
        blocks = {"qkv projection": (self._qkv_rows(0), [h]), "output projection + MLP": (self._mlp_rows(0), [h, q]),
                  "LM head": (self._head_rows(), [h])}
        return check_batch_invariance(blocks, max_rows)

    # ---- KV cache I/O ---------------------------------------------------------------------
    def _to_cache(self, x: torch.Tensor, scale: float, dtype: KvDtype) -> torch.Tensor:
        if dtype is KvDtype.FP8:
            return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
        return x.to(torch.float16 if dtype is KvDtype.FP16 else torch.bfloat16)

    def _from_cache(self, x: torch.Tensor, scale: float, dtype: KvDtype) -> torch.Tensor:
        if dtype is KvDtype.FP8:
            return x.view(torch.float8_e4m3fn).to(torch.float32) * scale
        return x.to(torch.float32)

    @staticmethod
    def _slots(chunks: Sequence[SeqChunk], tokens_per_block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(block id, offset in block) for every row of the forward pass, in row order."""
        blocks, offsets = [], []
        for c in chunks:
            pos = torch.arange(c.start_pos, c.end_pos)
            blocks.append(torch.tensor(c.block_table, dtype=torch.long)[pos // tokens_per_block])
            offsets.append(pos % tokens_per_block)
        return torch.cat(blocks), torch.cat(offsets)

    @staticmethod
    def _read_kv(layer: torch.Tensor, block_ids: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """A sequence's cached K and V: [2, num_tokens, kvh, d] in the cache dtype."""
        gathered = layer[block_ids].transpose(0, 1)               # [2, nb, tpb, kvh, d]
        return gathered.reshape(2, -1, *gathered.shape[3:])[:, :num_tokens]

    # ---- forward --------------------------------------------------------------------------
    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: SeqChunk) -> torch.Tensor:
        # q [n, H, d]; k, v [T, kvH, d] with T = chunk.end_pos
        n, total = q.shape[0], k.shape[0]
        qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        if n == total:
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
        elif n == 1:
            out = F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
        else:
            q_pos = torch.arange(chunk.start_pos, chunk.end_pos).unsqueeze(1)
            mask = torch.arange(total).unsqueeze(0) <= q_pos
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
        return out.transpose(0, 1).reshape(n, -1)

    def forward(self, chunks: Sequence[SeqChunk], pool: KvPool,
                on_layer_done: Callable[[int], None] | None = None) -> torch.Tensor:
        """Runs `chunks` (see _forward_pass); with a step trace set (trtpd/engine/step_trace.py), records the pass."""
        if self.trace is None:
            return self._forward_pass(chunks, pool, on_layer_done)
        started, cpu, proc_cpu, host = time.monotonic(), time.thread_time(), time.process_time(), host_cpu_s()
        logits = self._forward_pass(chunks, pool, on_layer_done)
        dt_s, host_after = time.monotonic() - started, host_cpu_s()
        self.trace.write({"kind": "forward", "t_s": started, "dt_s": dt_s,
                          "cpu_s": time.thread_time() - cpu, "proc_cpu_s": time.process_time() - proc_cpu,
                          "host_busy_s": host_after[0] - host[0], "host_steal_s": host_after[1] - host[1],
                          "rows": [[c.num_tokens, c.start_pos] for c in chunks]})
        return logits

    def _forward_pass(self, chunks: Sequence[SeqChunk], pool: KvPool,
                      on_layer_done: Callable[[int], None] | None = None) -> torch.Tensor:
        """Runs `chunks` (prefills and single-token decodes mixed), writes their KV into `pool`
        layer by layer, and returns the logits of each chunk's last row, [len(chunks), vocab]."""
        spec, w, dtype = self.spec, self.w, pool.layout.dtype
        ids = torch.tensor([t for c in chunks for t in c.token_ids], dtype=torch.long)
        positions = torch.cat([torch.arange(c.start_pos, c.end_pos) for c in chunks])
        bounds = [0]
        for c in chunks:
            bounds.append(bounds[-1] + c.num_tokens)
        num_rows = bounds[-1]
        h = pad_rows(w["model.embed_tokens.weight"][ids], padded_rows(num_rows))
        tpb = pool.layout.tokens_per_block
        slot_blocks, slot_offsets = self._slots(chunks, tpb)
        read_blocks = [torch.tensor(c.block_table[:-(-c.end_pos // tpb)], dtype=torch.long) for c in chunks]
        for i in range(spec.num_layers):
            q, k, v = self._split_qkv(tile_map(self._qkv_rows(i), h)[:num_rows])
            q, k = self._rope(q, positions), self._rope(k, positions)
            layer = pool.layers[i]
            layer[slot_blocks, 0, slot_offsets] = self._to_cache(k, self.k_scales[i], dtype)
            layer[slot_blocks, 1, slot_offsets] = self._to_cache(v, self.v_scales[i], dtype)
            attn = []
            for j, c in enumerate(chunks):
                cached = self._read_kv(layer, read_blocks[j], c.end_pos)
                kc = self._from_cache(cached[0], self.k_scales[i], dtype)
                vc = self._from_cache(cached[1], self.v_scales[i], dtype)
                attn.append(self._attention(q[bounds[j]:bounds[j + 1]], kc, vc, c))
            if on_layer_done is not None:
                on_layer_done(i)
            h = tile_map(self._mlp_rows(i), h, pad_rows(torch.cat(attn), h.shape[0]))
        last = torch.tensor([b - 1 for b in bounds[1:]], dtype=torch.long)
        return tile_map(self._head_rows(), pad_rows(h[last], padded_rows(len(chunks))))[:len(chunks)]

    def kv_amax(self, token_ids: list[int]) -> tuple[list[float], list[float]]:
        """Per-layer max |K| and |V| for a prompt (FP8 KV calibration), computed in fp32."""
        n = len(token_ids)
        positions = torch.arange(n)
        h = pad_rows(self.w["model.embed_tokens.weight"][torch.tensor(token_ids, dtype=torch.long)], padded_rows(n))
        k_amax, v_amax = [], []
        for i in range(self.spec.num_layers):
            q, k, v = self._split_qkv(tile_map(self._qkv_rows(i), h)[:n])
            q, k = self._rope(q, positions), self._rope(k, positions)
            k_amax.append(float(k.abs().max()))
            v_amax.append(float(v.abs().max()))
            attn = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                  is_causal=True, enable_gqa=True)
            h = tile_map(self._mlp_rows(i), h, pad_rows(attn.transpose(0, 1).reshape(n, -1), h.shape[0]))
        return k_amax, v_amax


def init_weights(spec: ModelSpec, seed: int) -> dict[str, torch.Tensor]:
    """Deterministic random weights with Hugging Face Llama names.

    Variance-preserving (std 1/sqrt(fan_in), unit embeddings): every sublayer moves the residual as
    much as the embedding does, so the output depends on the whole context through attention; a
    corrupted or misplaced KV block changes the tokens. (With the usual std 0.02 a random model
    ignores its context and repeats one token, which would hide transfer bugs.)
    """
    gen = torch.Generator().manual_seed(seed)
    h, d = spec.hidden_size, spec.head_size

    def rand(rows: int, fan_in: int) -> torch.Tensor:
        return (torch.randn(rows, fan_in, generator=gen) / math.sqrt(fan_in)).float()

    w = {"model.embed_tokens.weight": torch.randn(spec.vocab_size, h, generator=gen).float()}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "self_attn.q_proj.weight"] = rand(spec.num_heads * d, h)
        w[p + "self_attn.k_proj.weight"] = rand(spec.num_kv_heads * d, h)
        w[p + "self_attn.v_proj.weight"] = rand(spec.num_kv_heads * d, h)
        w[p + "self_attn.o_proj.weight"] = rand(h, spec.num_heads * d)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
        w[p + "mlp.gate_proj.weight"] = rand(spec.intermediate_size, h)
        w[p + "mlp.up_proj.weight"] = rand(spec.intermediate_size, h)
        w[p + "mlp.down_proj.weight"] = rand(h, spec.intermediate_size)
    w["model.norm.weight"] = torch.ones(h)
    w["lm_head.weight"] = rand(spec.vocab_size, h)
    return w
