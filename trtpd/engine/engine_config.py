"""A reference engine's build-time configuration (config.json in its engine folder).

Mirrors what trtllm-build bakes into a TensorRT-LLM engine: sizes, KV dtype and tokens_per_block,
and per role the scheduling knobs. The role-tuned defaults follow the same reasoning as the GPU
recipes: prefill takes few, long requests (small batch, large token budget) and holds KV only
until decode pulls it; decode takes many short steps (large batch, token budget near the batch).
"""

from __future__ import annotations

import enum
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trtpd.catalog import KvDtype
from trtpd.errors import ConfigError


class Role(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=False)

    backend: str = "reference"
    model: str
    role: Role
    checkpoint_dir: str = "../checkpoint"      # relative to the engine folder
    kv_dtype: KvDtype
    tokens_per_block: int = Field(32, gt=0)
    max_batch_size: int = Field(gt=0)
    max_num_tokens: int = Field(gt=0)
    max_input_len: int = Field(gt=0)
    max_seq_len: int = Field(gt=0)
    max_beam_width: int = Field(1, ge=1, le=1)
    tp_size: int = Field(1, ge=1, le=1)
    num_kv_blocks: int = Field(gt=0)
    # prefill scheduling (seed 000 section 3.2)
    bucket_boundaries_tokens: list[int] = Field(default_factory=lambda: [64, 256, 512, 1024, 2048])
    bucket_timeout_ms: float = Field(5.0, ge=0)
    min_batch_size: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _check_sizes(self) -> "EngineConfig":
        if self.max_seq_len < self.max_input_len:
            raise ValueError(f"max_seq_len ({self.max_seq_len}) must be >= max_input_len ({self.max_input_len})")
        if self.role is not Role.DECODE and self.max_num_tokens < self.max_input_len:
            raise ValueError(f"{self.role.value}: max_num_tokens ({self.max_num_tokens}) must be >= max_input_len "
                             f"({self.max_input_len}), or the longest prompt can never be scheduled")
        blocks_per_seq = -(-self.max_seq_len // self.tokens_per_block)
        if self.num_kv_blocks < blocks_per_seq:
            raise ValueError(f"num_kv_blocks ({self.num_kv_blocks}) cannot hold one sequence of max_seq_len "
                             f"{self.max_seq_len} ({blocks_per_seq} blocks of {self.tokens_per_block} tokens)")
        return self

    @property
    def max_output_len(self) -> int:
        return self.max_seq_len - self.max_input_len

    def save(self, engine_dir: Path) -> Path:
        path = Path(engine_dir) / "config.json"
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def load(cls, engine_dir: Path) -> "EngineConfig":
        path = Path(engine_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{engine_dir}: no config.json; build it with `trtpd build --backend reference`")
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except (ValidationError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: invalid engine config: {exc}") from None

    def checkpoint_path(self, engine_dir: Path) -> Path:
        return (Path(engine_dir) / self.checkpoint_dir).resolve()


def role_defaults(role: Role, max_input_len: int, max_output_len: int, tokens_per_block: int) -> dict:
    max_seq_len = max_input_len + max_output_len
    blocks_per_seq = -(-max_seq_len // tokens_per_block)
    if role is Role.PREFILL:
        # Small batches of long prompts; KV is held only until pulled, so room for ~16 prompts.
        return dict(max_batch_size=8, max_num_tokens=max(4096, max_input_len),
                    num_kv_blocks=16 * -(-max_input_len // tokens_per_block))
    if role is Role.DECODE:
        # Many sequences, one token each per step: token budget ~ batch size.
        return dict(max_batch_size=32, max_num_tokens=32, num_kv_blocks=32 * blocks_per_seq)
    return dict(max_batch_size=32, max_num_tokens=max(4096, max_input_len), num_kv_blocks=32 * blocks_per_seq)
