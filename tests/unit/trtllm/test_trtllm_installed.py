"""Checks against a real TensorRT-LLM 1.2.x installation (skip cleanly where there is none)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

import pytest

from trtpd.trtllm.plan import plan_build

needs_trtllm = pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is None,
                                  reason="tensorrt_llm is not installed (TensorRT-LLM 1.2.x container only)")


@pytest.mark.trtllm
@needs_trtllm
def test_installed_version_is_the_pinned_line():
    import importlib.metadata
    from trtpd.trtllm.versions import is_pinned_trtllm
    assert is_pinned_trtllm(importlib.metadata.version("tensorrt_llm"))


@pytest.mark.trtllm
@pytest.mark.gpu
@needs_trtllm
@pytest.mark.skipif(shutil.which("trtllm-build") is None, reason="trtllm-build not on PATH")
def test_trtllm_build_accepts_every_flag_trtpd_emits(request_for):
    help_text = subprocess.run(["trtllm-build", "--help"], capture_output=True, text=True, timeout=300).stdout
    plan = plan_build(request_for(prefill_tp=2, decode_tp=4))
    for role in plan.roles:
        for flag, _ in role.build_step.args:
            assert flag in help_text, f"installed trtllm-build does not know {flag}"


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no NVIDIA GPU here")
def test_gpus_are_detected():
    from trtpd.trtllm.environment import detect
    assert detect().gpu_names
