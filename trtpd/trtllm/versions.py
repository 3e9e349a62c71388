"""The pinned TensorRT-LLM stack that every emitted flag, key and path is written for.

Compiled TensorRT engines served by Triton's `tensorrtllm` C++ backend with context/generation
disaggregation exist up to the TensorRT-LLM 1.2.x line; upstream deleted that path in mid-2026
(trtllm-1.2.md §0). trtpd pins TensorRT-LLM 1.2.1 with TensorRT 10.14.1.48, as NVIDIA ships them in
`nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3`: triton-inference-server/server
docs/introduction/compatibility.md, branch r26.04 @dd16c0c, row 26.04 (TensorRT 10.14.1.48, TensorRT-LLM
1.2.1). The 25.12 Triton image ships TensorRT-LLM 1.1.0 with TensorRT 10.13.3.9 (same table). Every image
and its evidence: docs/containers.md; the image table: trtllm/containers.py.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StackVersions:
    tensorrt_llm: str = "1.2.1"
    triton_container: str = "26.04"         # the NGC release of tritonserver:<this>-trtllm-python-py3
    tensorrt: str = "10.14.1.48"
    # Where the Triton trtllm container keeps TensorRT-LLM's examples; both layouts: trtllm/containers.py.
    trtllm_examples_dir: str = "/app/examples"
    tritonserver_bin: str = "/opt/tritonserver/bin/tritonserver"

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if not k.endswith(("_dir", "_bin"))}


PINNED = StackVersions()


def is_pinned_trtllm(version: str) -> bool:
    """Exactly the pinned release: engines are built and served by one TensorRT-LLM (1.2.0 ships in
    tritonserver:26.03 with the same TensorRT, but a plan built by another release is not the one trtpd checked)."""
    return version == PINNED.tensorrt_llm


def same_tensorrt(installed: str, pinned: str = PINNED.tensorrt) -> bool:
    """A TensorRT engine deserializes only under the TensorRT that built it: the numbered parts must agree
    (a `.postN` or `+local` suffix of the Python package is not part of the library version)."""
    numbers = re.findall(r"\d+", installed.split("+")[0].split(".post")[0])
    return bool(numbers) and numbers == pinned.split(".")[:len(numbers)] and len(numbers) >= 3
