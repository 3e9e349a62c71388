"""Bad input gets a clear error naming the flag or file and the fix, before anything is written."""

from __future__ import annotations

import json

import pytest

from trtpd.trtllm.spec import auto_tp
from trtpd.catalog import get_model
from trtpd.errors import ConfigError, UnknownModelError


def test_unknown_model(request_for):
    with pytest.raises(UnknownModelError, match="unknown model 'llama-9'.*known models: .*llama-2-70b"):
        request_for("llama-9")


def test_checkpoint_folder_without_config_json(request_for, tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path}: no config.json"):
        request_for(str(tmp_path))


def test_checkpoint_folder_with_config_json(request_for, tmp_path):
    ckpt = tmp_path / "my-llama"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 8192}))
    r = request_for(str(ckpt), prefill_tp=2, decode_tp=2)
    assert r.model.name == "my-llama" and r.model_source == str(ckpt)


def test_tp_must_divide_kv_heads(request_for):
    with pytest.raises(ConfigError, match=r"--decode-tp 3 does not divide llama-2-70b's 8 KV heads.*use one of 1, 2, 4, 8"):
        request_for(prefill_tp=4, decode_tp=3)


def test_pp_must_divide_layers(request_for):
    with pytest.raises(ConfigError, match="--prefill-pp 3 does not divide llama-2-70b's 80 layers"):
        request_for(prefill_tp=4, decode_tp=4, prefill_pp=3)


def test_lengths_must_fit_the_model(request_for):
    with pytest.raises(ConfigError, match=r"--max-input-len 4000 \+ --max-output-len 512 = 4512 exceeds llama-2-70b's "
                                          r"max_position_embeddings 4096"):
        request_for(prefill_tp=4, decode_tp=4, max_input_len=4000)


def test_prefill_token_budget_must_hold_the_longest_prompt(request_for):
    with pytest.raises(ConfigError, match="--prefill-max-num-tokens 1024 is below --max-input-len 2048"):
        request_for(prefill_tp=4, decode_tp=4, prefill_max_num_tokens=1024)


def test_tokens_per_block_power_of_two(request_for):
    with pytest.raises(ConfigError, match="--tokens-per-block 48 is not a power of two"):
        request_for(prefill_tp=4, decode_tp=4, tokens_per_block=48)


def test_too_many_gpus(request_for):
    with pytest.raises(ConfigError, match=r"needs 12 GPUs .*--gpus-per-node is 8"):
        request_for(prefill_tp=4, decode_tp=4, decode_instances=2)


def test_non_positive_values(request_for):
    with pytest.raises(ConfigError, match="--decode-max-batch-size must be positive"):
        request_for(decode_max_batch_size=0)


def test_warnings_for_odd_but_legal_sizes(request_for):
    r = request_for(prefill_tp=4, decode_tp=4, prefill_max_num_tokens=32768, decode_max_batch_size=512)
    assert any("32768 > 16384" in w for w in r.warnings)
    assert any("--decode-max-batch-size 512 > --decode-max-num-tokens 256" in w for w in r.warnings)


def test_auto_tp_sizes_by_weight_bytes():
    assert auto_tp(get_model("llama-2-70b"), 1.0, 80) == 2      # 64 GiB of FP8 weights -> TP2
    assert auto_tp(get_model("llama-2-70b"), 2.0, 80) == 4      # 128 GiB of fp16 -> TP4
    assert auto_tp(get_model("llama-3.1-8b"), 2.0, 80) == 1
    with pytest.raises(ConfigError, match="weights do not fit"):
        auto_tp(get_model("llama-2-70b"), 2.0, 16)


def test_decode_chunked_context_follows_the_token_budget(request_for):
    assert request_for(prefill_tp=4, decode_tp=4).decode.enable_chunked_context is True
    assert request_for(prefill_tp=4, decode_tp=4, decode_max_num_tokens=2048).decode.enable_chunked_context is False
