"""DeepSeek-V3-style models (MLA attention, MoE MLPs) composed from AIConfigurator's measured tables.

One device's share at TP t, attention tensor-parallel over t devices and the routed experts expert-parallel
over the same t (EP t, MoE TP 1: TensorRT-LLM's narrow-EP layout, AIConfigurator's default for it), per
layer:
* the MLA block as AIConfigurator measured it whole (mla_context_module / mla_generation_module: the q and
  kv low-rank projections, the latent attention and the output projection, heads / t per device), for the
  model itself or, when its shapes are DeepSeek-V3's (V3.1, R1), DeepSeek-V3's rows;
* two all-reduces of tokens x hidden (after attention, after the MLP);
* a MoE layer (all but the first first_k_dense_layers): the shared experts' gate-up and down GEMMs (split
  over t), the bf16 router GEMM and the routed experts (moe_perf, at AIConfigurator's default skewed
  routing, power_law_1.01); in a decode step TensorRT-LLM runs the shared experts on a second CUDA stream,
  so the layer's MoE costs the longer of (router, all-reduces, routed experts) and the shared experts;
* a dense layer: the dense MLP's GEMMs (intermediate_size / t);
plus the bf16 LM head. GEMMs are fp8 block-scaled (DeepSeek's FP8 checkpoints) or bf16.

AIConfigurator treats every layer as a MoE layer (its DeepSeek model has no dense layers) and adds the
norms, the activation and the embedding from speed-of-light formulas; trtpd's sum has the dense layers and
leaves those out.
"""

from __future__ import annotations

from trtpd.catalog import ModelSpec
from trtpd.errors import ConfigError
from trtpd.perf.aiconfigurator import ComposedSteps

GEMM_DTYPES = {"fp8": "fp8_block", "fp16": "bfloat16", "bf16": "bfloat16"}
KV_DTYPES = {"fp8": "fp8", "fp16": "bfloat16", "bf16": "bfloat16"}
DISTRIBUTION = "power_law_1.01"
DEEPSEEK_V3 = "deepseek-ai/DeepSeek-V3"      # the MLA module tables' model; V3.1 and R1 share its shapes


def _same_shapes_as_v3(m: ModelSpec) -> bool:
    return (m.num_heads, m.hidden_size, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
            m.v_head_dim) == (128, 7168, 1536, 512, 128, 64, 128)


class AicMlaMoeComposer(ComposedSteps):
    """Forward-pass latencies (seconds) of an MLA + MoE model; the same interface as AicComposer."""

    def __init__(self, system, model: ModelSpec, tp: int, weight_dtype: str, kv_dtype: str) -> None:
        if not (model.is_mla and model.is_moe):
            raise ConfigError(f"{model.name}: AicMlaMoeComposer composes MLA + MoE models (DeepSeek-V3 style)")
        if weight_dtype not in GEMM_DTYPES or kv_dtype not in KV_DTYPES:
            raise ConfigError(f"weight dtype {weight_dtype!r} / KV dtype {kv_dtype!r}: use fp8, fp16 or bf16")
        if model.num_heads % tp or model.moe_intermediate_size * model.num_shared_experts % tp:
            raise ConfigError(f"{model.name}: TP {tp} does not divide its heads / shared experts")
        self.system, self.model, self.tp = system, model, tp
        self.gemm_dtype, self.kv_dtype = GEMM_DTYPES[weight_dtype], KV_DTYPES[kv_dtype]
        self.moe_tp, self.moe_ep = 1, tp
        self.table_models = tuple(dict.fromkeys([model.hf_id or model.name]
                                                + ([DEEPSEEK_V3] if _same_shapes_as_v3(model) else [])))

    def _gemm(self, m: int, n: int, k: int, dtype: str | None = None) -> float:
        return self.system.gemm_ms(m, n, k, dtype or self.gemm_dtype)

    def layer_ops_ms(self, phase: str, num_tokens: int, batch: int, length: float) -> dict[str, float]:
        """One layer of each kind, by operator (ms): phase context (batch prompts of length) or generation
        (batch sequences at context length); num_tokens in the pass."""
        m, t, h = self.model, self.tp, self.model.hidden_size
        shared = m.num_shared_experts * m.moe_intermediate_size // t
        ops = {
            "mla_module": self.system.mla_module_ms(phase, batch, length, m.num_heads // t, self.kv_dtype,
                                                    self.gemm_dtype, self.table_models),
            "all_reduce": 2 * self.system.allreduce_ms(t, num_tokens * h),
            "shared_gemms": self._gemm(num_tokens, 2 * shared, h) + self._gemm(num_tokens, h, shared),
            "router_gemm": self._gemm(num_tokens, m.num_experts, h, "bfloat16"),
            "moe": self.system.moe_ms(num_tokens, (h, m.moe_intermediate_size, m.num_experts_per_tok, m.num_experts),
                                      self.moe_tp, self.moe_ep, self.gemm_dtype, DISTRIBUTION),
            "dense_mlp_gemms": (self._gemm(num_tokens, 2 * m.intermediate_size // t, h)
                                + self._gemm(num_tokens, h, m.intermediate_size // t)),
        }
        return ops

    def _ops_ms(self, phase: str, num_tokens: int, batch: int, length: float) -> dict[str, float]:
        m, layer = self.model, self.layer_ops_ms(phase, num_tokens, batch, length)
        moe_layers, dense_layers = m.num_moe_layers, m.num_layers - m.num_moe_layers
        routed = layer["router_gemm"] + layer["all_reduce"] + layer["moe"]
        if phase == "generation":      # shared experts on a second stream, next to the routed path
            moe_layer = {"moe_overlap": max(routed, layer["shared_gemms"])}
        else:
            moe_layer = {k: layer[k] for k in ("shared_gemms", "router_gemm", "all_reduce", "moe")}
        ops = {"mla_module": m.num_layers * layer["mla_module"]}
        for k, v in moe_layer.items():
            ops[k] = moe_layers * v
        ops["all_reduce"] = ops.get("all_reduce", 0.0) + dense_layers * layer["all_reduce"]
        ops["dense_mlp_gemms"] = dense_layers * layer["dense_mlp_gemms"]
        ops["logits_gemm"] = self._gemm(batch, m.vocab_size // self.tp, m.hidden_size, "bfloat16")
        return ops

    def context_ops_ms(self, batch_size: int, isl: int) -> dict[str, float]:
        return self._ops_ms("context", batch_size * isl, batch_size, isl)

    def decode_ops_ms(self, batch_size: int, context_len: int) -> dict[str, float]:
        return self._ops_ms("generation", batch_size, batch_size, context_len)

    @property
    def backend(self) -> str:
        v = self.system.versions
        return (f"aiconfigurator {self.system.system} {self.system.framework} (gemm {v.get('gemm')}, mla "
                f"{v.get('mla')}, moe {v.get('moe')}, all-reduce {v.get('comm', '-')}), {self.gemm_dtype} GEMMs, "
                f"EP{self.moe_ep}")
