"""The shape of a paged KV cache, and the check that two of them can exchange blocks.

What must match between prefill and decode (TensorRT-LLM's CacheFormatter::inquireSupport):
KV dtype, tokens_per_block, layers, KV heads, head size. For fp8 the per-layer scales must match
too (engines calibrated differently would silently corrupt each other's cache), so the layout
carries a digest of them. TP may differ in TensorRT-LLM; the reference engine has TP 1.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

from trtpd.catalog import KvDtype, ModelSpec


@dataclass(frozen=True)
class KvLayout:
    num_layers: int
    num_kv_heads: int
    head_size: int
    tokens_per_block: int
    dtype: KvDtype
    scales_digest: str | None = None   # fp8 only: digest of the per-layer K/V scales

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", KvDtype.parse(self.dtype))
        for name in ("num_layers", "num_kv_heads", "head_size", "tokens_per_block"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KvLayout.{name} must be positive, got {getattr(self, name)}")

    @classmethod
    def for_model(cls, spec: ModelSpec, dtype: KvDtype | str, tokens_per_block: int,
                  scales_digest: str | None = None) -> "KvLayout":
        return cls(spec.num_layers, spec.num_kv_heads, spec.head_size, tokens_per_block,
                   KvDtype.parse(dtype), scales_digest)

    @property
    def bytes_per_token_per_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_size * self.dtype.num_bytes

    @property
    def bytes_per_block_per_layer(self) -> int:
        return self.tokens_per_block * self.bytes_per_token_per_layer

    def bytes_for(self, num_tokens: int) -> int:
        """Exact KV bytes of `num_tokens` tokens: layers x tokens x 2 x KV heads x head size x dtype bytes."""
        return self.num_layers * num_tokens * self.bytes_per_token_per_layer

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dtype"] = self.dtype.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "KvLayout":
        return cls(int(d["num_layers"]), int(d["num_kv_heads"]), int(d["head_size"]),
                   int(d["tokens_per_block"]), KvDtype.parse(d["dtype"]), d.get("scales_digest"))

    def mismatches(self, other: "KvLayout", self_name: str = "prefill", other_name: str = "decode") -> list[str]:
        """Human-readable differences that make a KV transfer between the two impossible."""
        problems = []
        fixes = {
            "dtype": "build both engines with the same KV dtype (e.g. --kv-dtype fp8 on both)",
            "tokens_per_block": "build both engines with the same --tokens-per-block",
            "num_layers": "prefill and decode must run the same model",
            "num_kv_heads": "prefill and decode must run the same model",
            "head_size": "prefill and decode must run the same model",
            "scales_digest": "build both engines from the same FP8-calibrated checkpoint",
        }
        for field, fix in fixes.items():
            mine, theirs = getattr(self, field), getattr(other, field)
            if field == "dtype":
                mine, theirs = mine.value, theirs.value
            if mine != theirs:
                problems.append(f"KV {field} differs: {self_name} has {mine}, {other_name} has {theirs}; {fix}")
        return problems


def scales_digest(k_scales: list[float], v_scales: list[float]) -> str:
    text = ",".join(f"{x:.9g}" for x in [*k_scales, *v_scales])
    return hashlib.sha256(text.encode()).hexdigest()[:16]
