"""Model catalog: architectures and exact KV-cache sizes.

KV bytes per token = 2 (K and V) x num_layers x num_kv_heads x head_size x dtype bytes.
Llama-2-70B (80 layers, GQA with 8 KV heads, head size 128) is 327,680 bytes (320 KiB) per token in
fp16 and 163,840 in fp8. Seed 000's "2.5 MB per token" is the MHA figure (64 KV heads) and is wrong
for GQA.
"""

from __future__ import annotations

import enum
import json
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
    """A decoder-only Llama-family architecture (RMSNorm, RoPE, GQA, SwiGLU)."""

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
    def num_params(self) -> int:
        """Exact parameter count: embeddings, attention, SwiGLU MLP, norms, LM head."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_size
        attn = h * (self.num_heads * self.head_size) + 2 * h * kv + (self.num_heads * self.head_size) * h
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + self.num_layers * per_layer + h + lm_head

    def kv_bytes_per_token(self, dtype: KvDtype | str) -> int:
        dtype = KvDtype.parse(dtype)
        return 2 * self.num_layers * self.num_kv_heads * self.head_size * dtype.num_bytes

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
