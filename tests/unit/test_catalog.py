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
        if spec.is_mla:
            continue
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


def test_deepseek_v3_mla_kv_bytes_match_the_published_config():
    # config.json: kv_lora_rank 512, qk_rope_head_dim 64, 61 layers: one 576-wide latent per token and layer
    m = get_model("deepseek-v3")
    assert m.is_mla and m.kv_elements_per_token_per_layer == 512 + 64
    assert m.kv_bytes_per_token("bf16") == 576 * 61 * 2 == 70_272
    assert m.kv_bytes_per_token("fp8") == 35_136
    assert m.kv_bytes_per_token_per_device(8, "fp8") == 35_136      # the latent is replicated across TP ranks
    assert get_model("llama-2-70b").kv_bytes_per_token("bf16") / m.kv_bytes_per_token("bf16") > 4.6


def test_deepseek_v3_total_and_active_parameters():
    # DeepSeek-V3 report: 671B total, 37B activated per token (main model, without the MTP module)
    m = get_model("deepseek-v3.1")
    assert m.num_params == pytest.approx(671e9, rel=0.002)
    assert m.num_active_params == pytest.approx(37.5e9, rel=0.02)
    # one routed expert: 3 x 7168 x 2048; 58 MoE layers of 256 routed + 1 shared
    assert m.expert_params == 3 * 7168 * 2048 and m.num_moe_layers == 58
    assert m.expected_experts_touched(1) == pytest.approx(8)
    assert 50 < m.expected_experts_touched(8) < 64
    assert m.expected_experts_touched(4096) == pytest.approx(256, rel=1e-6)


def test_opt_13b_is_mha_with_the_published_parameter_count():
    m = get_model("opt-13b")
    assert (m.num_layers, m.hidden_size, m.num_heads, m.gqa_group_size) == (40, 5120, 40, 1)
    assert m.num_params == pytest.approx(12.85e9, rel=0.002)
    assert m.kv_bytes_per_token("fp16") == 2 * 40 * 5120 * 2 == 819_200
