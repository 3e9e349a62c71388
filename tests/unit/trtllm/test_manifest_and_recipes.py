"""The engine manifest schema (shared with the reference backend) and the per-role recipes."""

from __future__ import annotations

import json

import pytest

from trtpd.schema.manifest import load_manifest, write_manifest
from trtpd.trtllm.plan import plan_build
from trtpd.trtllm.recipe import load_recipes, recipes_dir
from trtpd.errors import ConfigError


def test_manifest_round_trip_and_kv_layout(request_for, tmp_path):
    m = plan_build(request_for(prefill_tp=4, decode_tp=4)).prefill.manifest
    write_manifest(m, tmp_path)
    back = load_manifest(tmp_path)
    assert back == m and back.inputs_digest() == m.inputs_digest()
    layout = back.kv_layout()
    assert (layout.num_layers, layout.num_kv_heads, layout.head_size, layout.tokens_per_block) == (80, 8, 128, 32)
    assert layout.dtype.value == "fp8"


def test_manifest_errors_name_file_and_field(tmp_path):
    with pytest.raises(ConfigError, match="no engine manifest here"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"backend": "tensorrtllm", "role": "verify"}))
    with pytest.raises(ConfigError, match=r"manifest.json: field 'role'"):
        load_manifest(tmp_path)


def test_reference_backend_manifest_is_accepted(request_for, tmp_path):
    m = plan_build(request_for("llama-3.1-8b", prefill_tp=1, decode_tp=1, fp8=False)).decode.manifest
    ref = m.model_copy(update={"backend": "reference", "steps": [], "status": "complete"})
    write_manifest(ref, tmp_path)
    assert load_manifest(tmp_path).backend == "reference"


def test_recipes_load_and_share_the_pair_invariants():
    r = load_recipes()
    assert r.common.tokens_per_block == 32 and r.common.max_beam_width == 1 and r.common.fp8
    assert r.prefill.enable_kv_cache_reuse is False
    assert r.prefill.max_batch_size == "auto" and r.decode.cuda_graph_cache_size == "auto"
    assert (r.prefill.kv_cache_max_tokens, r.decode.kv_cache_max_tokens) == ("none", "batch")
    assert r.prefill.max_num_tokens >= r.common.max_input_len
    assert r.decode.cuda_graph_mode and not r.prefill.cuda_graph_mode


def test_every_recipe_key_carries_its_reasoning():
    for path in sorted(recipes_dir().glob("*.yaml")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line and not line.startswith((" ", "#")):
                j = i - 1
                while j >= 0 and lines[j].strip() and not lines[j].startswith("#"):
                    j -= 1                     # keys grouped under one comment share it
                assert j >= 0 and lines[j].startswith("#"), f"{path.name}:{i + 1} {line!r} has no comment explaining it"


def test_bad_recipe_names_file_and_key(tmp_path):
    for name in ("common", "prefill", "decode"):
        (tmp_path / f"{name}.yaml").write_text((recipes_dir() / f"{name}.yaml").read_text())
    (tmp_path / "decode.yaml").write_text("max_batch_size: 0\n")
    with pytest.raises(ConfigError,
                       match=r"decode.yaml: invalid content\n  max_batch_size\S*: Input should be greater than 0"):
        load_recipes(tmp_path)
