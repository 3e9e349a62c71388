import json

import pytest

from trtpd.catalog import CATALOG, KvDtype, get_model, resolve_model, spec_from_hf_config
from trtpd.errors import ConfigError, UnknownModelError


def test_llama2_70b_kv_bytes_per_token_is_320_kib_in_fp16():
    m = get_model("llama-2-70b")
    assert m.kv_bytes_per_token("fp16") == 327_680 == 320 * 1024
    assert m.kv_bytes_per_token("bf16") == 327_680
    assert m.kv_bytes_per_token(KvDtype.FP8) == 163_840


def test_kv_bytes_per_request_follows_the_formula():
    for name, spec in CATALOG.items():
        for dtype in KvDtype:
            expected = 2 * spec.num_layers * spec.num_kv_heads * spec.head_size * dtype.num_bytes * 2048
            assert spec.kv_bytes_per_request(2048, dtype) == expected, name
    assert get_model("llama-2-70b").kv_bytes_per_request(2048, "fp16") == 671_088_640


@pytest.mark.parametrize("name, params", [
    ("llama-2-7b", 6_738_415_616), ("llama-2-13b", 13_015_864_320), ("llama-2-70b", 68_976_648_192),
    ("llama-3.1-8b", 8_030_261_248), ("mistral-7b", 7_241_732_096),
])
def test_parameter_counts_match_the_published_checkpoints(name, params):
    assert get_model(name).num_params == params


def test_gqa_and_mha_shapes():
    assert get_model("llama-2-7b").gqa_group_size == 1
    assert get_model("llama-2-70b").gqa_group_size == 8
    assert get_model("llama-2-70b").head_size == 128


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(UnknownModelError, match="llama-2-70b"):
        get_model("llama-9-1t")


def test_unknown_kv_dtype_names_the_field():
    with pytest.raises(ConfigError, match="kv_dtype.*int4"):
        KvDtype.parse("int4")


def test_checkpoint_folder_without_config_json_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_hf_config_is_validated(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4096}))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        resolve_model(str(tmp_path))
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 80, "hidden_size": 8192,
              "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 32000}
    spec = spec_from_hf_config(config, "local-70b")
    assert spec.kv_bytes_per_token("fp16") == get_model("llama-2-70b").kv_bytes_per_token("fp16")


def test_heads_must_divide_by_kv_heads():
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 6, "num_key_value_heads": 4,
              "intermediate_size": 128, "vocab_size": 100}
    with pytest.raises(ConfigError, match="multiple of num_kv_heads"):
        spec_from_hf_config(config, "odd")
