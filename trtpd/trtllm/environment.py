"""Can this machine run TensorRT-LLM 1.2.x builds? (tensorrt_llm importable, a GPU present)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass, field

from trtpd.trtllm.versions import PINNED, is_supported_trtllm
from trtpd.errors import TrtpdError


class TrtllmUnavailableError(TrtpdError):
    """TensorRT-LLM or a GPU is missing, or the installed TensorRT-LLM is not 1.2.x."""


@dataclass(frozen=True)
class BuildEnvironment:
    trtllm_version: str | None
    gpu_names: list[str] = field(default_factory=list)


def detect() -> BuildEnvironment:
    version = None
    if importlib.util.find_spec("tensorrt_llm") is not None:
        try:
            version = importlib.metadata.version("tensorrt_llm")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    return BuildEnvironment(version, _gpu_names())


def _gpu_names() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def require_runnable(env: BuildEnvironment, num_gpus_needed: int) -> None:
    hint = ("run `trtpd build ... --dry-run` to print the exact commands, or `--configs-only` to write the "
            "serving configs and planned manifests without building")
    if env.trtllm_version is None:
        raise TrtllmUnavailableError(
            f"tensorrt_llm is not importable here; engines are built with TensorRT-LLM {PINNED.tensorrt_llm} "
            f"(Triton {PINNED.triton_container} trtllm container) on NVIDIA GPUs. {hint[0].upper()}{hint[1:]}")
    if not is_supported_trtllm(env.trtllm_version):
        raise TrtllmUnavailableError(
            f"tensorrt_llm {env.trtllm_version} is installed, but trtpd's engine path is pinned to 1.2.x "
            f"({PINNED.tensorrt_llm}); later releases removed trtllm-build. Use the Triton "
            f"{PINNED.triton_container} trtllm container, or {hint}")
    if len(env.gpu_names) < num_gpus_needed:
        raise TrtllmUnavailableError(
            f"this build needs {num_gpus_needed} GPU(s) for quantization at the largest TP, nvidia-smi shows "
            f"{len(env.gpu_names)}; {hint}")
