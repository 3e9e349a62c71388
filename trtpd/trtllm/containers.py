"""The containers trtpd's engine path runs in, as data: image, what it ships, where its examples are.

Every claim here is read upstream; docs/containers.md gives each file, branch and commit.
- triton-26.04: nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3. NVIDIA's Triton compatibility
  matrix lists it with TensorRT-LLM 1.2.1 and TensorRT 10.14.1.48 (triton-inference-server/server
  docs/introduction/compatibility.md, r26.04 @dd16c0c). Layout from the TensorRT-LLM backend's Dockerfile of
  that release (triton-inference-server/tensorrtllm_backend dockerfile/Dockerfile.triton.trt_llm_backend,
  r26.04 @ce68ff5: TENSORRTLLM_VER=1.2.1, TRT_VER=10.14.1.48; `WORKDIR /app`, `COPY ... examples examples`
  -> /app/examples; python is the venv /opt/venv-tritonserver, first on PATH). It runs both paths: Triton's
  tensorrtllm backend and trtllm-serve (the same tensorrt_llm wheel).
- trtllm-1.2.1: nvcr.io/nvidia/tensorrt-llm/release:1.2.1, TensorRT-LLM's own release image (tag = the
  version: TensorRT-LLM docs installation/containers.html; docker/Makefile `ngc-release_pull`). Stage
  `release` of docker/Dockerfile.multi builds FROM devel, not tritondevel: no /opt/tritonserver, so it runs
  trtllm-serve only. `WORKDIR /app/tensorrt_llm`, `COPY examples examples` -> /app/tensorrt_llm/examples.
Neither has trtpd installed: the deploy folder carries it (trtpd/trtllm/deploy.py, python/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtpd.errors import ConfigError
from trtpd.trtllm.versions import PINNED

CHECKPOINT_SCRIPTS = ("quantization/quantize.py", "models/core/llama/convert_checkpoint.py")
COMPATIBILITY_MATRIX = ("triton-inference-server/server docs/introduction/compatibility.md "
                        "(docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/"
                        "compatibility.html)")


@dataclass(frozen=True)
class ContainerLayout:
    name: str
    image: str
    examples_dir: str
    python: str
    source: str                 # where the layout was read
    has_tritonserver: bool      # /opt/tritonserver/bin/tritonserver: only then can it run launch_triton.sh
    tensorrt_llm: str
    tensorrt: str
    evidence: str               # where the versions were read

    def missing_scripts(self, examples_dir: str | None = None) -> list[str]:
        root = Path(examples_dir or self.examples_dir)
        return [str(root / s) for s in CHECKPOINT_SCRIPTS if not (root / s).is_file()]


CONTAINERS: dict[str, ContainerLayout] = {
    "triton-26.04": ContainerLayout(
        "triton-26.04", "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3", "/app/examples",
        "/opt/venv-tritonserver/bin/python3",
        "tensorrtllm_backend dockerfile/Dockerfile.triton.trt_llm_backend@ce68ff5 (r26.04; WORKDIR /app; COPY ... "
        "examples)", has_tritonserver=True, tensorrt_llm="1.2.1", tensorrt="10.14.1.48",
        evidence=f"{COMPATIBILITY_MATRIX} @dd16c0c (r26.04), row 26.04"),
    "trtllm-1.2.1": ContainerLayout(
        "trtllm-1.2.1", "nvcr.io/nvidia/tensorrt-llm/release:1.2.1", "/app/tensorrt_llm/examples", "python3",
        "TensorRT-LLM docker/Dockerfile.multi stage release (WORKDIR /app/tensorrt_llm; COPY examples examples)",
        has_tritonserver=False, tensorrt_llm="1.2.1", tensorrt="10.14.1.48",
        evidence="TensorRT-LLM release images are tagged with their version (docs installation/containers.html, "
                 "docker/Makefile ngc-release_pull); TensorRT from docker/common/install_tensorrt.sh of the 1.2 "
                 "line (TRT_VER=10.14.1.48, PyTorch 25.12 base); scripts/gpu_smoke.py prints what the image has"),
}
DEFAULT_CONTAINER = "triton-26.04"      # the one that runs both the Triton path and trtllm-serve

# Images users reach for that ship another TensorRT-LLM: named so the refusal can say why and what instead.
OTHER_RELEASES: dict[str, tuple[str, str, str]] = {          # name: (image, TensorRT-LLM, TensorRT)
    "triton-25.12": ("nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3", "1.1.0", "10.13.3.9"),
    "triton-26.01": ("nvcr.io/nvidia/tritonserver:26.01-trtllm-python-py3", "1.1.0", "10.13.3.9"),
    "triton-26.02": ("nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3", "1.1.0", "10.13.3.9"),
    "triton-26.03": ("nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3", "1.2.0", "10.14.1.48"),
}


def pinned_images_text() -> str:
    """Which images ship the pinned stack, for any message that sends the user to one."""
    triton = CONTAINERS[DEFAULT_CONTAINER]
    serve_only = [c for c in CONTAINERS.values() if not c.has_tritonserver]
    text = f"{triton.image} (--container {triton.name}: the Triton path and trtllm-serve)"
    for c in serve_only:
        text += f" or {c.image} (--container {c.name}: trtllm-serve only)"
    return f"{text}; both ship TensorRT-LLM {PINNED.tensorrt_llm} with TensorRT {PINNED.tensorrt}"


def container_layout(name: str) -> ContainerLayout:
    if name in OTHER_RELEASES:
        image, trtllm, tensorrt = OTHER_RELEASES[name]
        raise ConfigError(f"--container {name}: {image} ships TensorRT-LLM {trtllm} with TensorRT {tensorrt} "
                          f"({COMPATIBILITY_MATRIX}); trtpd is pinned to {PINNED.tensorrt_llm}. Use "
                          f"{pinned_images_text()}")
    try:
        return CONTAINERS[name]
    except KeyError:
        raise ConfigError(f"--container {name}: use one of {', '.join(CONTAINERS)} or auto") from None


def detect_container(root: Path = Path("/")) -> ContainerLayout | None:
    """The layout whose examples folder exists under `root` (the running container), or None. The layout
    alone cannot tell the Triton releases apart: the version check before a build does (environment.py)."""
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
