"""Shared fixtures for build tests: recipes and a request factory with a fixed engines folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpd.trtllm.recipe import load_recipes
from trtpd.trtllm.spec import BuildOverrides, make_request

ENGINES = Path("/srv/trtpd/engines")      # never written: plans only name it

# (case name, model, overrides): the golden cases of the issue.
GOLDEN_CASES = {
    "llama-2-70b-tp4-tp4-fp8": ("llama-2-70b", {"prefill_tp": 4, "decode_tp": 4, "fp8": True}),
    "llama-2-70b-tp2-tp4-fp8": ("llama-2-70b", {"prefill_tp": 2, "decode_tp": 4, "fp8": True}),
    "llama-3.1-8b-tp1-tp1-fp16": ("llama-3.1-8b", {"prefill_tp": 1, "decode_tp": 1, "fp8": False}),
}


@pytest.fixture(scope="session")
def recipes():
    return load_recipes()


@pytest.fixture
def request_for(recipes):
    def build(model: str = "llama-2-70b", engines_dir: Path = ENGINES, **overrides):
        extra = {k: overrides.pop(k) for k in ("hf_model", "gpus_per_node", "gpu_memory_gib", "modelopt_dir")
                 if k in overrides}
        return make_request(model, recipes, BuildOverrides(**overrides), engines_dir=engines_dir, **extra)
    return build


@pytest.fixture(scope="session")
def golden_cases():
    return GOLDEN_CASES
