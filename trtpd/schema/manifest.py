"""The engine manifest: what was built, from what, how, and whether it finished.

One `manifest.json` sits in every engine folder, `engines/<model>/<role>-tp<N>/` (plus `-pp<M>`
when PP > 1). Both backends write it: `tensorrtllm` (quantize + trtllm-build) and `reference`
(CPU weights). `trtpd lint` checks a prefill/decode pair from two manifests alone, so everything
that decides KV compatibility is in `build_config`, `model` and, for FP8 KV, `kv_scales_digest`.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtpd.catalog import KvDtype, ModelSpec
from trtpd.errors import ConfigError
from trtpd.kv.layout import KvLayout

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1

Role = Literal["prefill", "decode", "colocated"]   # colocated: the reference backend's one-model baseline
Backend = Literal["tensorrtllm", "reference"]
Status = Literal["planned", "building", "complete", "failed"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelShape(_Strict):
    """The architecture fields that decide KV compatibility."""

    name: str
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)

    @classmethod
    def of(cls, spec: ModelSpec) -> "ModelShape":
        return cls(name=spec.name, num_layers=spec.num_layers, num_heads=spec.num_heads,
                   num_kv_heads=spec.num_kv_heads, head_size=spec.head_size, vocab_size=spec.vocab_size,
                   max_position_embeddings=spec.max_position_embeddings)


class EngineBuildConfig(_Strict):
    """The engine's compiled limits (trtllm-build's BuildConfig, or the reference engine's)."""

    kv_dtype: KvDtype
    tokens_per_block: int = Field(gt=0)
    max_batch_size: int = Field(gt=0)
    max_num_tokens: int = Field(gt=0)
    max_input_len: int = Field(gt=0)
    max_seq_len: int = Field(gt=0)
    max_beam_width: int = Field(gt=0)
    tp_size: int = Field(gt=0)
    pp_size: int = Field(gt=0)


class BuildInputs(_Strict):
    """Where the weights came from and how they were converted."""

    model_source: str                       # catalog name, HF id or HF checkpoint folder
    checkpoint_dir: str | None = None       # TensorRT-LLM checkpoint (per TP/PP size)
    weights_dtype: str = "float16"          # dtype of the non-quantized parts
    quantization: Literal["fp8", "none"] = "none"
    kv_cache_quant_algo: Literal["FP8", "none"] = "none"


class StepRecord(_Strict):
    """One command the build ran (or, in a planned manifest, will run)."""

    name: str                                # e.g. "quantize", "trtllm-build"
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    output_dir: str
    status: Literal["planned", "skipped", "ok", "failed"] = "planned"
    duration_s: float | None = None
    log_path: str | None = None


class FileChecksum(_Strict):
    path: str                                # relative to the engine folder
    sha256: str
    size_bytes: int


class EngineManifest(_Strict):
    schema_version: int = SCHEMA_VERSION
    backend: Backend
    role: Role
    model: ModelShape
    build_config: EngineBuildConfig
    inputs: BuildInputs
    # fp8: digest of the per-layer KV scaling factors this engine writes and reads KV with (tensorrtllm: read back
    # from the quantize.py checkpoint, trtllm/kv_scales.py; reference: its checkpoint's K/V scales). Known once
    # built (None in planned manifests); `trtpd lint` (kv-scales) requires prefill's and decode's to be equal.
    kv_scales_digest: str | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict)
    checksums: list[FileChecksum] = Field(default_factory=list)
    status: Status = "planned"
    error: str | None = None
    updated_at: str | None = None            # ISO 8601, UTC; None in planned manifests

    @property
    def folder_name(self) -> str:
        return engine_folder_name(self.role, self.build_config.tp_size, self.build_config.pp_size)

    def kv_layout(self) -> KvLayout:
        return KvLayout(self.model.num_layers, self.model.num_kv_heads, self.model.head_size,
                        self.build_config.tokens_per_block, self.build_config.kv_dtype,
                        self.kv_scales_digest)

    def inputs_digest(self) -> str:
        """Digest of everything that determines the engine bytes; equal digests mean 'skip'."""
        payload = self.model_dump(mode="json", include={"backend", "role", "model", "build_config",
                                                        "inputs", "versions"})
        payload["argv"] = [s.argv for s in self.steps]
        text = json.dumps(payload, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=False) + "\n"


def now_iso() -> str:
    """The manifests' timestamp format (`updated_at`): ISO 8601, UTC, whole seconds."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def engine_folder_name(role: str, tp_size: int, pp_size: int = 1) -> str:
    return f"{role}-tp{tp_size}" + (f"-pp{pp_size}" if pp_size > 1 else "")


def load_manifest(path: Path) -> EngineManifest:
    """Reads `path` (a manifest.json or an engine folder), naming the file and field at fault."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.is_file():
        raise ConfigError(f"{path}: no engine manifest here; build the engine first (trtpd build)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    try:
        return EngineManifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: field {field!r}: {first['msg']} "
                          f"({exc.error_count()} problem(s); rebuild or fix the manifest)") from None


def write_manifest(manifest: EngineManifest, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / MANIFEST_NAME
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(manifest.to_json())
    tmp.replace(target)
    return target
