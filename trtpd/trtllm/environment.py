"""Can this machine run the pinned TensorRT-LLM build? (tensorrt_llm 1.2.1 and its TensorRT, GPUs present).

The check names the images that ship the pinned stack (trtllm/containers.py), so a user inside another
release (the 25.12 Triton image ships TensorRT-LLM 1.1.0) is sent somewhere else, never back to it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass, field

from trtpd.trtllm.containers import pinned_images_text
from trtpd.trtllm.versions import PINNED, is_pinned_trtllm, same_tensorrt
from trtpd.errors import TrtpdError


class TrtllmUnavailableError(TrtpdError):
    """TensorRT-LLM or a GPU is missing, or the installed TensorRT-LLM/TensorRT is not the pinned one."""


@dataclass(frozen=True)
class BuildEnvironment:
    trtllm_version: str | None
    gpu_names: list[str] = field(default_factory=list)
    tensorrt_version: str | None = None       # None: not found (then tensorrt_llm's own import decides)


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def detect() -> BuildEnvironment:
    version = None
    if importlib.util.find_spec("tensorrt_llm") is not None:
        version = _installed("tensorrt_llm") or "unknown"
    return BuildEnvironment(version, _gpu_names(), _installed("tensorrt"))


def _gpu_names() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


HINT = ("run `trtpd build ... --dry-run` to print the exact commands, or `--configs-only` to write the serving "
        "configs and planned manifests without building")


def require_runnable(env: BuildEnvironment, num_gpus_needed: int) -> None:
    if env.trtllm_version is None:
        raise TrtllmUnavailableError(
            f"tensorrt_llm is not importable here; engines are built with TensorRT-LLM {PINNED.tensorrt_llm} on "
            f"NVIDIA GPUs, inside {pinned_images_text()}. Or {HINT}")
    if not is_pinned_trtllm(env.trtllm_version):
        raise TrtllmUnavailableError(
            f"tensorrt_llm {env.trtllm_version} is installed, but trtpd's engine path is pinned to "
            f"{PINNED.tensorrt_llm} (engines, flags and configs are written for that release; releases after 1.2 "
            f"removed trtllm-build). Build inside {pinned_images_text()}. Or {HINT}")
    if env.tensorrt_version is not None and not same_tensorrt(env.tensorrt_version):
        raise TrtllmUnavailableError(
            f"TensorRT {env.tensorrt_version} is installed, but the serving images run TensorRT {PINNED.tensorrt}: "
            f"engines built here do not deserialize there. Build inside {pinned_images_text()}")
    if len(env.gpu_names) < num_gpus_needed:
        raise TrtllmUnavailableError(
            f"this build needs {num_gpus_needed} GPU(s) for quantization at the largest TP, nvidia-smi shows "
            f"{len(env.gpu_names)}; {HINT}")
