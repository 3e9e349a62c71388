"""Shared fixtures: reference engines built once per test session into a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def engines_dir(tmp_path_factory) -> Path:
    from trtpd.engine.reference_engines import build_reference

    root = tmp_path_factory.mktemp("engines")
    for kv_dtype in ("fp16", "fp8"):
        build_reference("tiny-llama", root, kv_dtype=kv_dtype)
    return root


@pytest.fixture(scope="session")
def fp16_root(engines_dir) -> Path:
    return engines_dir / "tiny-llama" / "reference-fp16"


@pytest.fixture(scope="session")
def fp8_root(engines_dir) -> Path:
    return engines_dir / "tiny-llama" / "reference-fp8"
