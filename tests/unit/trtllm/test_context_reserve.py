"""What a context request reserves under guaranteed_no_evict by the output length it carries, and that README's
table ("Context requests: output length") is what trtpd computes from the catalog."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpd.catalog import KvDtype, get_model
from trtpd.trtllm.context_reserve import context_batch_reserve, reserved_blocks

README = Path(__file__).resolve().parents[3] / "README.md"
GIB = 1024 ** 3


def test_a_request_reserves_prompt_plus_output_in_whole_blocks():
    assert reserved_blocks(2048, 512, 32) == 80
    assert reserved_blocks(2048, 1, 32) == 65               # the next token starts a new block
    assert reserved_blocks(2048, 0, 32) == 64
    assert reserved_blocks(4000, 512, 32, window=4096) == 128


@pytest.mark.parametrize("prompt", [2048, 512, 128, 32])
def test_readme_table_is_computed_from_the_catalog(prompt):
    big, small = get_model("llama-2-70b"), get_model("llama-3.1-8b")
    rows = {n: context_batch_reserve(big, KvDtype.FP8, prompt, n, max_num_tokens=8192, max_batch_size=256,
                                     tokens_per_block=32) for n in (512, 1)}
    fp16 = {n: context_batch_reserve(small, KvDtype.FP16, prompt, n, max_num_tokens=8192, max_batch_size=256,
                                     tokens_per_block=32) for n in (512, 1)}
    extra_70b = (rows[512].bytes_total - rows[1].bytes_total) / 2 / GIB          # prefill TP2: half per GPU
    extra_8b = (fp16[512].bytes_total - fp16[1].bytes_total) / GIB
    row = (f"| {prompt} | {rows[512].num_requests} | {rows[512].blocks_per_request} / {rows[1].blocks_per_request} "
           f"| {rows[512].blocks} / {rows[1].blocks} | {extra_70b:.2f} GiB per GPU | {extra_8b:.2f} GiB |")
    assert row in README.read_text()
