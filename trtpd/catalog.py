"""Model catalog: architectures and exact KV-cache sizes.

KV bytes per token = 2 (K and V) x num_layers x num_kv_heads x head_size x dtype bytes.
Llama-2-70B (80 layers, GQA with 8 KV heads, head size 128) is 327,680 bytes (320 KiB) per token in
fp16 and 163,840 in fp8. Seed 000's "2.5 MB per token" is the MHA figure (64 KV heads) and is wrong
for GQA.

MLA (DeepSeek-V2/V3) caches one compressed latent per token and layer, shared by all heads:
(kv_lora_rank + qk_rope_head_dim) x num_layers x dtype bytes = (512 + 64) x 61 x 2 = 70,272 bytes per
token in bf16 for DeepSeek-V3 (35,136 in fp8), 4.7x less than Llama-2-70B's GQA. Under TP every rank
holds the whole latent (it is not split by heads).

MoE (DeepSeek-V3: 256 routed experts, 8 per token, 1 shared, the first 3 layers dense): all
671B parameters are resident, ~37B are active per token (FLOPs follow the active ones; the weights a
decode step reads grow with the batch as more experts are hit: `expected_experts_touched`).
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from pathlib import Path

from trtpd.errors import ConfigError, UnknownModelError


class KvDtype(str, enum.Enum):
    """KV-cache element type. fp8 is e4m3 with a per-layer scale, as TensorRT-LLM's FP8 KV cache."""

    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"

    @property
    def num_bytes(self) -> int:
        return 1 if self is KvDtype.FP8 else 2

    @classmethod
    def parse(cls, value: "str | KvDtype", field: str = "kv_dtype") -> "KvDtype":
        if isinstance(value, KvDtype):
            return value
        aliases = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float8": "fp8", "fp8_e4m3": "fp8"}
        text = aliases.get(str(value).lower(), str(value).lower())
        try:
            return cls(text)
        except ValueError:
            allowed = ", ".join(d.value for d in cls)
            raise ConfigError(f"{field}: unknown KV dtype {value!r}; use one of {allowed}") from None


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only architecture: Llama-family (RMSNorm, RoPE, GQA, SwiGLU) by default; OPT-style
    (LayerNorm and biases, GELU MLP of two matrices, learned positions) with has_bias/mlp_matrices;
    MLA attention when kv_lora_rank > 0; MoE MLPs when num_experts > 0."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    hf_id: str | None = None
    mlp_matrices: int = 3                 # SwiGLU: gate, up, down; GELU (OPT): fc1, fc2
    has_bias: bool = False                # OPT: biases on every linear, LayerNorm with bias
    num_position_embeddings: int = 0      # learned positions (OPT: 2050 rows); 0 for RoPE
    # MLA (DeepSeek): q_lora_rank 0 = a plain q projection
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE (DeepSeek): routed experts of moe_intermediate_size, num_experts_per_tok of them per token,
    # shared experts on every token, the first first_k_dense_layers layers dense (intermediate_size)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0
    first_k_dense_layers: int = 0

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_size",
                      "intermediate_size", "vocab_size", "max_position_embeddings"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"model {self.name!r}: {field} must be positive, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model {self.name!r}: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})")

    @property
    def gqa_group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_params_per_layer(self) -> int:
        h, heads = self.hidden_size, self.num_heads
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk) if self.q_lora_rank \
                else h * heads * qk
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + heads * self.v_head_dim * h
        q, kv = heads * self.head_size, self.num_kv_heads * self.head_size
        bias = (q + 2 * kv + h) if self.has_bias else 0
        return h * q + 2 * h * kv + q * h + bias

    def _mlp_params(self, intermediate: int) -> int:
        bias = (intermediate + self.hidden_size) if self.has_bias else 0
        return self.mlp_matrices * self.hidden_size * intermediate + bias

    @property
    def expert_params(self) -> int:
        """One routed (or shared) expert's MLP."""
        return self._mlp_params(self.moe_intermediate_size) if self.is_moe else 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense_layers if self.is_moe else 0

    def _moe_layer_params(self, num_routed: int) -> int:
        router = self.num_experts * self.hidden_size
        return (num_routed + self.num_shared_experts) * self.expert_params + router

    def _total(self, num_routed: int) -> int:
        h = self.hidden_size
        norms = 2 * h * (2 if self.has_bias else 1)
        dense = self.num_layers - self.num_moe_layers
        layers = (self.num_layers * (self.attention_params_per_layer + norms)
                  + dense * self._mlp_params(self.intermediate_size)
                  + self.num_moe_layers * self._moe_layer_params(num_routed))
        embed = self.vocab_size * h + self.num_position_embeddings * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + layers + h * (2 if self.has_bias else 1) + lm_head

    @property
    def num_params(self) -> int:
        """Exact parameter count (all resident): embeddings, attention, MLPs or experts, norms, LM head."""
        return self._total(self.num_experts)

    @property
    def num_active_params(self) -> int:
        """Parameters one token computes with: the routed experts it picks, the shared ones, the rest."""
        return self._total(self.num_experts_per_tok) if self.is_moe else self.num_params

    def expected_experts_touched(self, num_tokens: float) -> float:
        """Distinct routed experts one MoE layer reads for a batch of num_tokens (uniform routing):
        E x (1 - (1 - k/E)^n); k for one token, all E for large batches."""
        if not self.is_moe or num_tokens <= 0:
            return float(self.num_experts_per_tok if self.is_moe else 0)
        e, k = self.num_experts, self.num_experts_per_tok
        return e * (1.0 - math.exp(num_tokens * math.log1p(-k / e)))

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_size

    def kv_bytes_per_token(self, dtype: KvDtype | str) -> int:
        dtype = KvDtype.parse(dtype)
        return self.num_layers * self.kv_elements_per_token_per_layer * dtype.num_bytes

    def kv_bytes_per_token_per_device(self, tp: int, dtype: KvDtype | str) -> int:
        """One TP rank's share: GQA/MHA split KV heads (at least one per rank); MLA's latent is replicated."""
        dtype = KvDtype.parse(dtype)
        if self.is_mla:
            return self.kv_bytes_per_token(dtype)
        return 2 * self.num_layers * max(1, self.num_kv_heads // tp) * self.head_size * dtype.num_bytes

    @property
    def prefill_attention_dim(self) -> int:
        """d in the attention FLOPs 2 x layers x d x sum(L^2) (QK^T and PV, causal halves): heads x
        (q.k width + v width) / 2; MLA prefill computes full heads (192 + 128 wide)."""
        if self.is_mla:
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) // 2
        return self.num_heads * self.head_size

    @property
    def decode_attention_dim(self) -> int:
        """d in 4 x layers x d x context: MLA decode attends over the latent with absorbed weights
        (scores over kv_lora_rank + rope dims, values over kv_lora_rank)."""
        if self.is_mla:
            return self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim) // 2
        return self.num_heads * self.head_size

    def kv_bytes_per_request(self, num_tokens: int, dtype: KvDtype | str) -> int:
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return num_tokens * self.kv_bytes_per_token(dtype)

    def weight_bytes(self, bytes_per_param: float) -> int:
        return int(self.num_params * bytes_per_param)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
           max_pos: int, hf_id: str, rope_theta: float = 10000.0, eps: float = 1e-5) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads,
                     num_kv_heads=kv_heads, head_size=hidden // heads, intermediate_size=ffn,
                     vocab_size=vocab, max_position_embeddings=max_pos, rope_theta=rope_theta,
                     rms_norm_eps=eps, hf_id=hf_id)


# Values from each model's Hugging Face config.json.
CATALOG: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, "meta-llama/Llama-2-7b-hf"),
        _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, "meta-llama/Llama-2-13b-hf"),
        _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, "meta-llama/Llama-2-70b-hf"),
        _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072, "meta-llama/Llama-3.1-8B",
               rope_theta=500000.0),
        _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072, "meta-llama/Llama-3.1-70B",
               rope_theta=500000.0),
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768, "mistralai/Mistral-7B-v0.1"),
        # OPT-13B (DistServe's chatbot model): MHA, LayerNorm and biases, ReLU MLP of two matrices, learned
        # positions (2,048 + 2 offset rows), tied embeddings (facebook/opt-13b config.json)
        ModelSpec(name="opt-13b", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=40, head_size=128,
                  intermediate_size=20480, vocab_size=50272, max_position_embeddings=2048,
                  tie_word_embeddings=True, hf_id="facebook/opt-13b", mlp_matrices=2, has_bias=True,
                  num_position_embeddings=2050),
        # DeepSeek-V3 and V3.1 share one architecture (deepseek-ai/DeepSeek-V3 config.json; the multi-token
        # prediction module, num_nextn_predict_layers=1, is left out: 671B main-model parameters)
        *(ModelSpec(name=name, num_layers=61, hidden_size=7168, num_heads=128, num_kv_heads=128, head_size=128,
                    intermediate_size=18432, vocab_size=129280, max_position_embeddings=163840, rms_norm_eps=1e-6,
                    hf_id=hf, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                    v_head_dim=128, num_experts=256, num_experts_per_tok=8, num_shared_experts=1,
                    moe_intermediate_size=2048, first_k_dense_layers=3)
          for name, hf in (("deepseek-v3", "deepseek-ai/DeepSeek-V3"), ("deepseek-v3.1", "deepseek-ai/DeepSeek-V3.1"))),
        # The reference model: small enough that a 1,500-token prefill takes well under a second on
        # two CPU cores, and shaped like Llama (GQA 2:1, SwiGLU, RoPE) so every code path is real.
        _llama("tiny-llama", 4, 256, 8, 4, 768, 1536, 4096, "trtpd/tiny-llama"),
    )
}


def model_names() -> list[str]:
    return sorted(CATALOG)


def get_model(name: str) -> ModelSpec:
    key = name.lower()
    if key not in CATALOG:
        raise UnknownModelError(
            f"unknown model {name!r}; known models: {', '.join(model_names())} "
            f"(or pass a Hugging Face checkpoint folder that has a config.json)")
    return CATALOG[key]


def spec_from_hf_config(config: dict, name: str, source: str = "config.json") -> ModelSpec:
    """Builds a ModelSpec from a Hugging Face Llama/Mistral config.json, naming missing fields."""
    required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in required if k not in config]
    if missing:
        raise ConfigError(f"{source}: missing field(s) {', '.join(missing)}; is this a Llama-family checkpoint?")
    arch = config.get("architectures") or []
    if arch and not any(a in ("LlamaForCausalLM", "MistralForCausalLM") for a in arch):
        raise ConfigError(f"{source}: architectures={arch}; trtpd supports LlamaForCausalLM and MistralForCausalLM")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    return ModelSpec(
        name=name,
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads", heads)),
        head_size=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        rope_theta=float(config.get("rope_theta", 10000.0)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def resolve_model(name_or_path: str) -> ModelSpec:
    """A catalog name, or a Hugging Face checkpoint folder whose config.json is validated."""
    path = Path(name_or_path)
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ConfigError(f"{path}: no config.json in this checkpoint folder; pass a Hugging Face "
                              f"checkpoint folder or a catalog name ({', '.join(model_names())})")
        try:
            config = json.loads(cfg.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{cfg}: not valid JSON ({exc})") from None
        return spec_from_hf_config(config, name=path.name, source=str(cfg))
    return get_model(name_or_path)
