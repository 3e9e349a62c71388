"""The two containers trtpd's engine path runs in, as data: image, examples folder, python.

Read from the Dockerfiles that build them:
- triton-25.12: triton-inference-server/tensorrtllm_backend dockerfile/Dockerfile.triton.trt_llm_backend
  @0b9d7d5 (TENSORRTLLM_REPO_TAG=release/1.2.1 since 8addf2f): final stage `WORKDIR /app`, then
  `COPY --from=tensorrt_llm_code .../tensorrt_llm/examples examples` -> /app/examples (scripts, all_models,
  tools beside it); python is the venv `/opt/venv-tritonserver` put first on PATH.
- trtllm-1.2.1: NVIDIA/TensorRT-LLM docker/Dockerfile.multi (stage `release`, stored version 00f74ad):
  `WORKDIR /app/tensorrt_llm`, `COPY examples examples` -> /app/tensorrt_llm/examples; the wheel is
  pip-installed into the base image's system python.
Neither has trtpd installed: the deploy folder carries it (trtpd/trtllm/deploy.py, python/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtpd.errors import ConfigError

CHECKPOINT_SCRIPTS = ("quantization/quantize.py", "models/core/llama/convert_checkpoint.py")


@dataclass(frozen=True)
class ContainerLayout:
    name: str
    image: str
    examples_dir: str
    python: str
    source: str

    def missing_scripts(self, examples_dir: str | None = None) -> list[str]:
        root = Path(examples_dir or self.examples_dir)
        return [str(root / s) for s in CHECKPOINT_SCRIPTS if not (root / s).is_file()]


CONTAINERS: dict[str, ContainerLayout] = {
    "triton-25.12": ContainerLayout(
        "triton-25.12", "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3", "/app/examples",
        "/opt/venv-tritonserver/bin/python3",
        "tensorrtllm_backend dockerfile/Dockerfile.triton.trt_llm_backend@0b9d7d5 (WORKDIR /app; COPY ... examples)"),
    "trtllm-1.2.1": ContainerLayout(
        "trtllm-1.2.1", "nvcr.io/nvidia/tensorrt-llm/release:1.2.1", "/app/tensorrt_llm/examples", "python3",
        "TensorRT-LLM docker/Dockerfile.multi stage release (WORKDIR /app/tensorrt_llm; COPY examples examples)"),
}
DEFAULT_CONTAINER = "triton-25.12"      # the one that runs both the Triton path and trtllm-serve


def container_layout(name: str) -> ContainerLayout:
    try:
        return CONTAINERS[name]
    except KeyError:
        raise ConfigError(f"--container {name}: use one of {', '.join(CONTAINERS)} or auto") from None


def detect_container(root: Path = Path("/")) -> ContainerLayout | None:
    """The layout whose examples folder exists under `root` (the running container), or None."""
    for layout in CONTAINERS.values():
        if not layout.missing_scripts(str(root / layout.examples_dir.lstrip("/"))):
            return layout
    return None


def choose_container(name: str, root: Path = Path("/")) -> ContainerLayout:
    """`auto`: the detected layout, else the default (plans made off the GPU box target it)."""
    if name != "auto":
        return container_layout(name)
    return detect_container(root) or CONTAINERS[DEFAULT_CONTAINER]


def require_examples(layout: ContainerLayout, examples_dir: str, scripts: list[str]) -> None:
    """Before a real build: the checkpoint scripts the plan calls (paths under examples_dir) must exist."""
    missing = [s for s in scripts if not Path(s).is_file()]
    if missing:
        others = [c.name for c in CONTAINERS.values() if c.examples_dir != examples_dir]
        raise ConfigError(
            f"TensorRT-LLM's examples are not where the build expects them: {', '.join(missing)} missing "
            f"(container layout {layout.name}: {layout.image} keeps them in {layout.examples_dir}). Run inside "
            f"that container, pass --container {' or '.join(others + ['auto'])} for another image, or point "
            f"--trtllm-examples at the folder holding quantization/quantize.py")
