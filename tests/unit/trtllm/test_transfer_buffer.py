"""TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE on the Triton MPI path: sized from the longest prompt's KV, passed to
every rank, in a form TensorRT-LLM's parseMemorySize reads; and the timeout claims scoped to where upstream
enforces kv_transfer_timeout_ms."""

from __future__ import annotations

import re

import pytest
import yaml

from trtpd.trtllm.run import prepare
from trtpd.trtllm.transfer_buffer import BUFFER_ENV, transfer_buffer_bytes, transfer_buffer_env

MIB = 1024 * 1024


@pytest.mark.parametrize("case, want_mib", [
    # (2048 + 32 tokens) x 80 layers x K,V x 8/4 KV heads x 128 x 1 byte (FP8) = 81.25 MiB
    ("llama-2-70b-tp4-tp4-fp8", 82),
    # prefill at TP2 holds 4 KV heads per rank: twice that
    ("llama-2-70b-tp2-tp4-fp8", 163),
    # 2080 x 32 layers x 2 x 8 heads x 128 x 2 bytes (fp16) = 260 MiB
    ("llama-3.1-8b-tp1-tp1-fp16", 260),
])
def test_the_buffer_holds_the_longest_prompt_on_the_fullest_rank(case, want_mib, golden_cases, request_for):
    model, overrides = golden_cases[case]
    prepared = prepare(request_for(model, **overrides))
    assert transfer_buffer_env(prepared.plan) == {BUFFER_ENV: f"{want_mib}MB"}
    assert (want_mib - 1) * MIB < transfer_buffer_bytes(prepared.plan) <= want_mib * MIB


def test_every_rank_gets_the_variable(request_for):
    script = prepare(request_for(prefill_tp=2, decode_tp=4)).deploy.files["launch_triton.sh"]
    value = re.search(rf"^export {BUFFER_ENV}=(\S+)$", script, re.M).group(1)
    assert re.fullmatch(r"\d+(\.\d+)?(b|kb|mb|gb|tb)", value.lower())     # envUtils.cpp parseMemorySize
    assert f"-x {BUFFER_ENV}" in script.split("exec mpirun", 1)[1].split("\n")[0]
    assert script.index(f"export {BUFFER_ENV}") < script.index("exec mpirun")


def test_claims_name_the_buffer_and_scope_the_timeout(request_for):
    files = prepare(request_for(prefill_tp=4, decode_tp=4)).deploy.files
    triton = files["launch_triton.sh"]
    assert "no KV-transfer timeout or buffer setting" not in triton
    assert "Use deploy/trtllm-serve for a finite kv_transfer_timeout_ms" not in triton
    assert "trtllm-serve\n# --backend tensorrt does not either" in triton
    prefill = files["trtllm-serve/prefill.yaml"]
    assert "kv_transfer_timeout_ms is finite so a lost peer frees the" not in prefill
    assert "executor only" in prefill
    assert yaml.safe_load(prefill)["cache_transceiver_config"]["max_tokens_in_buffer"] == 2048 + 32
