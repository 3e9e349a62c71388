"""The pinned TensorRT-LLM stack that every emitted flag, key and path is written for.

Compiled TensorRT engines served by Triton's `tensorrtllm` C++ backend with context/generation
disaggregation exist up to the TensorRT-LLM 1.2.x line; upstream deleted that path in mid-2026
(trtllm-1.2.md §0). The Triton backend repository's Dockerfile builds TensorRT-LLM release/1.2.1
on the Triton 25.12 container with TensorRT 10.14.1.48, so trtpd targets exactly that.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StackVersions:
    tensorrt_llm: str = "1.2.1"
    triton_container: str = "25.12"
    tensorrt: str = "10.14.1.48"
    # Where the Triton 25.12 trtllm container keeps TensorRT-LLM's examples; both layouts: build/containers.py.
    trtllm_examples_dir: str = "/app/examples"
    tritonserver_bin: str = "/opt/tritonserver/bin/tritonserver"

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if not k.endswith(("_dir", "_bin"))}


PINNED = StackVersions()


def is_supported_trtllm(version: str) -> bool:
    """True for any 1.2.x release (1.2.0, 1.2.1, 1.2.0rc6.post2, ...)."""
    parts = version.split(".")
    return len(parts) >= 2 and parts[0] == "1" and parts[1] == "2"
