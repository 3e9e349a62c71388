"""A reference checkpoint: weights (safetensors), tokenizer, and FP8 KV calibration.

Like a TensorRT-LLM checkpoint, it fixes the KV dtype (`quantization.kv_cache_quant_algo`) and, for
FP8, the per-layer K/V scales, so both engines built from it agree on the KV layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trtpd.catalog import KvDtype, ModelSpec
from trtpd.engine.tokenizer import Tokenizer
from trtpd.errors import ConfigError
from trtpd.kv.layout import KvLayout, scales_digest

WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "config.json"


@dataclass
class Checkpoint:
    spec: ModelSpec
    kv_dtype: KvDtype
    k_scales: list[float]
    v_scales: list[float]
    path: Path

    def layout(self, tokens_per_block: int) -> KvLayout:
        digest = scales_digest(self.k_scales, self.v_scales) if self.kv_dtype is KvDtype.FP8 else None
        return KvLayout.for_model(self.spec, self.kv_dtype, tokens_per_block, digest)

    def load_weights(self) -> dict[str, torch.Tensor]:
        return load_file(str(self.path / WEIGHTS_FILE))

    def load_tokenizer(self) -> Tokenizer:
        return Tokenizer.load(self.path / TOKENIZER_FILE)


def write_checkpoint(path: Path, spec: ModelSpec, weights: dict[str, torch.Tensor], tokenizer: Tokenizer,
                     kv_dtype: KvDtype, k_scales: list[float], v_scales: list[float], seed: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / WEIGHTS_FILE))
    tokenizer.save(path / TOKENIZER_FILE)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_size, "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size, "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": spec.rope_theta, "rms_norm_eps": spec.rms_norm_eps,
        "tie_word_embeddings": spec.tie_word_embeddings, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2,
        "trtpd": {"model": spec.name, "seed": seed},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": "FP8" if kv_dtype is KvDtype.FP8 else None,
                         "kv_cache_dtype": kv_dtype.value, "k_scales": k_scales, "v_scales": v_scales},
    }
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def load_checkpoint(path: Path) -> Checkpoint:
    from trtpd.catalog import spec_from_hf_config
    cfg_path = Path(path) / CONFIG_FILE
    if not cfg_path.is_file():
        raise ConfigError(f"{path}: not a reference checkpoint (no {CONFIG_FILE}); run `trtpd build --backend reference`")
    config = json.loads(cfg_path.read_text())
    name = config.get("trtpd", {}).get("model", Path(path).name)
    spec = spec_from_hf_config(config, name=name, source=str(cfg_path))
    quant = config.get("quantization", {})
    return Checkpoint(spec=spec, kv_dtype=KvDtype.parse(quant.get("kv_cache_dtype", "fp16")),
                      k_scales=list(quant["k_scales"]), v_scales=list(quant["v_scales"]), path=Path(path))
