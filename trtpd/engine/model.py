"""The reference decoder: Llama architecture (RMSNorm, RoPE, GQA, SwiGLU) over a paged KV cache.

Batch invariance. Greedy output through the disaggregated path must equal the colocated path token
for token, although the two batch requests differently. So every row's result must not depend on
which other rows share its batch:
- linear layers see rows padded to a multiple of 8 (MKL's small-M kernels, M < 4, accumulate in a
  different order), on one thread per process (thread splits can create such small blocks);
  `check_batch_invariance` verifies this on the running machine;
- attention runs per sequence, on K/V read back from the cache (so prefill attention sees exactly
  the cache-dtype values that decode will see);
- norms, RoPE and activations are row-wise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtpd.catalog import KvDtype, ModelSpec
from trtpd.kv.pool import KvPool

ROW_PAD = 8
FP8_MAX = 448.0


def invariant_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    padded = max(ROW_PAD, -(-rows // ROW_PAD) * ROW_PAD)
    if padded != rows:
        x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])
    return F.linear(x, weight)[:rows]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


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
                 k_scales: Sequence[float], v_scales: Sequence[float]) -> None:
        self.spec = spec
        self.w = weights
        self.k_scales = [float(s) for s in k_scales]
        self.v_scales = [float(s) for s in v_scales]
        half = spec.head_size // 2
        inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, half, dtype=torch.float64) / half))
        angles = torch.outer(torch.arange(spec.max_position_embeddings, dtype=torch.float64), inv_freq)
        self.cos = torch.cos(angles).float()
        self.sin = torch.sin(angles).float()

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
        """Runs `chunks` (prefills and single-token decodes mixed), writes their KV into `pool`
        layer by layer, and returns the logits of each chunk's last row, [len(chunks), vocab]."""
        spec, w, dtype = self.spec, self.w, pool.layout.dtype
        ids = torch.tensor([t for c in chunks for t in c.token_ids], dtype=torch.long)
        positions = torch.cat([torch.arange(c.start_pos, c.end_pos) for c in chunks])
        bounds = [0]
        for c in chunks:
            bounds.append(bounds[-1] + c.num_tokens)
        h = w["model.embed_tokens.weight"][ids]
        kvh, d = spec.num_kv_heads, spec.head_size
        tpb = pool.layout.tokens_per_block
        slot_blocks, slot_offsets = self._slots(chunks, tpb)
        read_blocks = [torch.tensor(c.block_table[:-(-c.end_pos // tpb)], dtype=torch.long) for c in chunks]
        for i in range(spec.num_layers):
            p = f"model.layers.{i}."
            x = rms_norm(h, w[p + "input_layernorm.weight"], spec.rms_norm_eps)
            q = invariant_linear(x, w[p + "self_attn.q_proj.weight"]).view(-1, spec.num_heads, d)
            k = invariant_linear(x, w[p + "self_attn.k_proj.weight"]).view(-1, kvh, d)
            v = invariant_linear(x, w[p + "self_attn.v_proj.weight"]).view(-1, kvh, d)
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
            h = h + invariant_linear(torch.cat(attn), w[p + "self_attn.o_proj.weight"])
            x = rms_norm(h, w[p + "post_attention_layernorm.weight"], spec.rms_norm_eps)
            gate = invariant_linear(x, w[p + "mlp.gate_proj.weight"])
            up = invariant_linear(x, w[p + "mlp.up_proj.weight"])
            h = h + invariant_linear(F.silu(gate) * up, w[p + "mlp.down_proj.weight"])
        last = torch.tensor([b - 1 for b in bounds[1:]], dtype=torch.long)
        x = rms_norm(h[last], w["model.norm.weight"], spec.rms_norm_eps)
        return invariant_linear(x, w["lm_head.weight"])

    def kv_amax(self, token_ids: list[int]) -> tuple[list[float], list[float]]:
        """Per-layer max |K| and |V| for a prompt (FP8 KV calibration), computed in fp32."""
        spec, w = self.spec, self.w
        ids = torch.tensor(token_ids, dtype=torch.long)
        positions = torch.arange(len(token_ids))
        h = w["model.embed_tokens.weight"][ids]
        k_amax, v_amax = [], []
        d = spec.head_size
        for i in range(spec.num_layers):
            p = f"model.layers.{i}."
            x = rms_norm(h, w[p + "input_layernorm.weight"], spec.rms_norm_eps)
            q = self._rope(invariant_linear(x, w[p + "self_attn.q_proj.weight"]).view(-1, spec.num_heads, d), positions)
            k = self._rope(invariant_linear(x, w[p + "self_attn.k_proj.weight"]).view(-1, spec.num_kv_heads, d), positions)
            v = invariant_linear(x, w[p + "self_attn.v_proj.weight"]).view(-1, spec.num_kv_heads, d)
            k_amax.append(float(k.abs().max()))
            v_amax.append(float(v.abs().max()))
            attn = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                  is_causal=True, enable_gqa=True)
            h = h + invariant_linear(attn.transpose(0, 1).reshape(len(token_ids), -1), w[p + "self_attn.o_proj.weight"])
            x = rms_norm(h, w[p + "post_attention_layernorm.weight"], spec.rms_norm_eps)
            h = h + invariant_linear(F.silu(invariant_linear(x, w[p + "mlp.gate_proj.weight"]))
                                     * invariant_linear(x, w[p + "mlp.up_proj.weight"]), w[p + "mlp.down_proj.weight"])
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


def check_batch_invariance(spec: ModelSpec, weights: dict[str, torch.Tensor], trials: int = 8) -> list[str]:
    """Checks on this machine that each linear layer's rows do not depend on their batch."""
    gen = torch.Generator().manual_seed(0)
    problems = []
    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight", "lm_head.weight"]
    for name in names:
        weight = weights[name]
        x = torch.randn(64, weight.shape[1], generator=gen)
        solo = torch.cat([invariant_linear(x[i:i + 1], weight) for i in range(x.shape[0])])
        for rows in (2, 3, 5, 8, 13, 64)[:trials]:
            if not torch.equal(invariant_linear(x[:rows], weight), solo[:rows]):
                problems.append(f"{name}: a batch of {rows} rows differs from the same rows one by one")
    return problems
