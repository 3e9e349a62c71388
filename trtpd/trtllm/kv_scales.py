"""The FP8 KV-cache scaling factors of a TensorRT-LLM checkpoint, read back and digested.

Prefill writes KV with its engine's scale and decode reads it with its own, so both must hold the same
per-layer scales. quantize.py bakes TP into the checkpoint (--tp_size), so a pair with different TP is
quantized twice, in two calibration runs; nothing upstream compares the two. trtpd reads the scales of
each checkpoint after quantize.py, refuses a pair whose digests differ (execute.py), and writes the
digest into each engine's manifest (`kv_scales_digest`), which `trtpd lint` compares.

Where the scales are (read 2026-12-03 through the search tool's stored files):
- One float32 scalar per attention layer, `<...>.kv_cache_scaling_factor` (NVIDIA/TensorRT-LLM
  tensorrt_llm/quantization/quantize.py@0614867 kv_cache_quantize: `Parameter(shape=(1,), dtype='float32')`; a
  newer stored version, commit not resolved, adds `kv_cache_rcp_scaling_factor` beside it). Older ModelOpt
  exports also write `k_cache_scaling_factor` / `v_cache_scaling_factor`; every one of these is read.
- ModelOpt writes them under `transformer.layers.<i>.attention.` with kv = max(k, v)
  (NVIDIA/TensorRT-Model-Optimizer modelopt/torch/export/model_config_utils.py split_config_and_weights
  @07b6b2b) and splits TP by copying scalar FP8 scales to every rank ("FC S S": all ranks hold the same
  scaling factor; postprocess.py _split_model_config_for_tp @1ef1d72). So within one checkpoint every rank of
  a TP group holds the same values; trtpd checks that too.
- Rank r of a checkpoint is pp_rank = r // tp_size with context parallelism 1 (NVIDIA/TensorRT-LLM
  tensorrt_llm/mapping.py Mapping.__init__: pp_rank = rank // (tp_size * cp_size); stored version, commit not
  resolved), so stages in rank order give the layers in model order, whatever each stage numbers them.
- The files are read with the safetensors library (safe_open: the header, then only the scale tensors).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtpd.errors import TrtpdError

SCALE_SUFFIXES = ("kv_cache_scaling_factor", "kv_cache_rcp_scaling_factor", "k_cache_scaling_factor",
                  "v_cache_scaling_factor")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class KvScalesError(TrtpdError):
    """A checkpoint's FP8 KV scales cannot be read, disagree across its ranks, or differ between the roles."""


@dataclass(frozen=True)
class KvScales:
    """Per layer (model order), the checkpoint's KV scale tensors by name suffix."""

    checkpoint_dir: Path
    layers: tuple[tuple[tuple[str, float], ...], ...]

    @property
    def digest(self) -> str:
        text = ";".join(",".join(f"{name}={value:.9g}" for name, value in layer) for layer in self.layers)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


_DTYPE_NAMES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}


def rank_scales(path: Path) -> tuple[tuple[tuple[str, float], ...], ...]:
    """One rank file's KV scales, per layer in the order of its layer numbers. Read with the safetensors library,
    which reads the header and only the tensors asked for (never the weights). Imported here: `trtpd build
    --dry-run` and the CLI's start-up stay free of it (tests/integration/test_cli_startup.py)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            by_layer: dict[int, list[tuple[str, float]]] = {}
            for name in f.keys():
                suffix = next((s for s in SCALE_SUFFIXES if name.endswith("." + s)), None)
                if suffix is None:
                    continue
                layer = _LAYER.search(name)
                if layer is None:
                    raise KvScalesError(f"{path}: KV scale {name} names no layer (expected "
                                        f"'...layers.<i>....{suffix}')")
                value = f.get_tensor(name)
                if value.dtype != np.float32 or value.size != 1:
                    dtype = _DTYPE_NAMES.get(value.dtype.name, value.dtype.name)
                    raise KvScalesError(f"{path}: tensor {name} is {dtype} {list(value.shape)}; TensorRT-LLM's KV "
                                        f"scaling factors are float32 scalars (shape (1,)); this is not a checkpoint "
                                        f"trtpd can check")
                by_layer.setdefault(int(layer.group(1)), []).append((suffix, float(value.reshape(-1)[0])))
    except SafetensorError as exc:
        raise KvScalesError(f"{path}: not a safetensors file ({exc})") from None
    return tuple(tuple(sorted(by_layer[i])) for i in sorted(by_layer))


def read_kv_scales(checkpoint_dir: Path, tp_size: int, pp_size: int = 1) -> KvScales:
    """The KV scales of a quantize.py checkpoint with this TP/PP; raises KvScalesError naming the file at fault."""
    folder = Path(checkpoint_dir)
    stages = []
    for pp_rank in range(pp_size):
        ranks = [folder / f"rank{pp_rank * tp_size + t}.safetensors" for t in range(tp_size)]
        missing = [p.name for p in ranks if not p.is_file()]
        if missing:
            raise KvScalesError(f"{folder}: {', '.join(missing)} missing for TP{tp_size} PP{pp_size}; rerun "
                                f"quantize.py (trtpd build --force)")
        first = rank_scales(ranks[0])
        for other in ranks[1:]:
            if rank_scales(other) != first:
                raise KvScalesError(f"{folder}: {other.name} holds other FP8 KV scales than {ranks[0].name}; the "
                                    f"ranks of one tensor-parallel group must share them; rerun quantize.py")
        stages.append(first)
    layers = tuple(layer for stage in stages for layer in stage)
    if not layers:
        raise KvScalesError(f"{folder}: no KV scaling factors (*.kv_cache_scaling_factor) in the checkpoint; was it "
                            f"quantized with --kv_cache_dtype fp8?")
    return KvScales(folder, layers)


def require_same_scales(prefill: KvScales, decode: KvScales) -> None:
    """Refuses a pair whose KV scales differ: prefill would write KV with one scale and decode read it with another."""
    if prefill.digest == decode.digest:
        return
    where = next((i for i, (p, d) in enumerate(zip(prefill.layers, decode.layers)) if p != d),
                 min(len(prefill.layers), len(decode.layers)))
    detail = (f"layer {where}: prefill {dict(prefill.layers[where])}, decode {dict(decode.layers[where])}"
              if where < min(len(prefill.layers), len(decode.layers))
              else f"{len(prefill.layers)} layers vs {len(decode.layers)}")
    raise KvScalesError(
        f"kv_scales_digest differs: prefill checkpoint {prefill.checkpoint_dir} has {prefill.digest}, decode "
        f"checkpoint {decode.checkpoint_dir} has {decode.digest} (first difference at {detail}): the two "
        f"quantize.py calibrations gave different FP8 KV scales, so decode would read prefill's KV with the wrong "
        f"scale. Build both roles at the same TP (one checkpoint, one calibration), or rerun with --force and "
        f"check that calibration is deterministic on this machine")
