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


def test_prefill_batch_is_sized_so_the_token_budget_ends_a_batch(request_for):
    """The recipe's `auto`: max_num_tokens / tokens_per_block, at most 256 (the planner's cap)."""
    assert request_for().prefill.max_batch_size == 256                           # 8192 / 32
    assert request_for(prefill_max_num_tokens=4096).prefill.max_batch_size == 128
    assert request_for(prefill_max_num_tokens=16384).prefill.max_batch_size == 256  # capped
    assert request_for(tokens_per_block=64).prefill.max_batch_size == 128
    assert request_for(prefill_max_batch_size=8).prefill.max_batch_size == 8      # a flag or a plan wins


def test_decode_kv_pool_is_capped_at_what_its_batch_can_reserve(request_for):
    r = request_for(prefill_tp=2, decode_tp=4)
    assert r.decode.kv_cache_max_tokens == 256 * 2560 and r.prefill.kv_cache_max_tokens is None
    assert request_for(decode_max_batch_size=64, max_output_len=500).decode.kv_cache_max_tokens == 64 * 2560
    # 2548 tokens round up to 80 blocks of 32: a request reserves whole blocks


def test_decode_cuda_graph_cache_fits_its_budget(request_for):
    assert (request_for().decode.cuda_graph_cache_size, request_for().prefill.cuda_graph_cache_size) == (64, 0)
    assert request_for(decode_max_batch_size=16, decode_max_num_tokens=256).decode.cuda_graph_cache_size == 16


def test_sizes_reach_both_serving_paths(request_for):
    from trtpd.trtllm.gpu_repo import role_parameters
    from trtpd.trtllm.mpi_world import plan_mpi_world
    from trtpd.trtllm.plan import plan_build
    from trtpd.trtllm.serve_config import role_llm_options
    plan = plan_build(request_for(prefill_tp=2, decode_tp=4))
    decode = role_llm_options(plan, plan.decode)
    assert decode["kv_cache_config"] == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.85,
                                         "max_tokens": 655360}
    assert decode["extended_runtime_perf_knob_config"]["cuda_graph_cache_size"] == 64
    assert "max_tokens" not in role_llm_options(plan, plan.prefill)["kv_cache_config"]
    params = role_parameters(plan, plan.decode, plan_mpi_world(plan.request))
    assert params["cuda_graph_cache_size"] == "64"
    assert params["max_tokens_in_paged_kv_cache"] == "655360"    # the same cap on the Triton path
    assert role_parameters(plan, plan.prefill, plan_mpi_world(plan.request))["max_tokens_in_paged_kv_cache"] == ""
