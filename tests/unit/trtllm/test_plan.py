"""The per-role build plan: exact commands, one checkpoint per TP size, role-tuned sizes."""

from __future__ import annotations

from trtpd.trtllm.plan import plan_build


def args_of(step) -> dict:
    return dict(step.args)


def test_same_tp_shares_one_checkpoint(request_for):
    plan = plan_build(request_for(prefill_tp=4, decode_tp=4))
    steps = plan.unique_steps()
    assert [s.name for s in steps] == ["quantize", "trtllm-build", "trtllm-build"]
    assert plan.prefill.checkpoint_step.output_dir == plan.decode.checkpoint_step.output_dir


def test_different_tp_gets_a_checkpoint_each(request_for):
    plan = plan_build(request_for(prefill_tp=2, decode_tp=4))
    quantize = [s for s in plan.unique_steps() if s.name == "quantize"]
    assert [args_of(s)["--tp_size"] for s in quantize] == ["2", "4"]
    assert [s.output_dir.name for s in quantize] == ["fp8-tp2", "fp8-tp4"]
    assert plan.prefill.engine_dir.name == "prefill-tp2" and plan.decode.engine_dir.name == "decode-tp4"


def test_fp8_quantizes_weights_and_kv(request_for):
    plan = plan_build(request_for(prefill_tp=4, decode_tp=4))
    q = args_of(plan.prefill.checkpoint_step)
    assert (q["--qformat"], q["--kv_cache_dtype"], q["--model_dir"]) == ("fp8", "fp8", "meta-llama/Llama-2-70b-hf")
    b = args_of(plan.prefill.build_step)
    assert b["--use_fp8_context_fmha"] == "enable" and b["--gemm_plugin"] == "disable"
    assert plan.prefill.manifest.build_config.kv_dtype.value == "fp8"
    assert plan.prefill.manifest.inputs.kv_cache_quant_algo == "FP8"


def test_fp8_off_converts_without_quantization(request_for):
    plan = plan_build(request_for("llama-3.1-8b", prefill_tp=1, decode_tp=1, fp8=False))
    step = plan.prefill.checkpoint_step
    assert step.name == "convert" and step.program[1].endswith("models/core/llama/convert_checkpoint.py")
    assert "--qformat" not in args_of(step) and args_of(step)["--dtype"] == "float16"
    assert args_of(plan.decode.build_step)["--use_fp8_context_fmha"] == "disable"
    assert plan.decode.manifest.build_config.kv_dtype.value == "fp16"


def test_role_tuned_sizes_and_shared_invariants(request_for):
    plan = plan_build(request_for(prefill_tp=2, decode_tp=4))
    p, d = args_of(plan.prefill.build_step), args_of(plan.decode.build_step)
    assert int(p["--max_batch_size"]) * 32 == int(p["--max_num_tokens"])   # the token budget ends a batch
    assert int(p["--max_num_tokens"]) >= int(p["--max_input_len"])          # whole prompt in one pass
    assert int(d["--max_num_tokens"]) == int(d["--max_batch_size"])         # ~ one token per request
    for key in ("--tokens_per_block", "--max_input_len", "--max_seq_len"):
        assert p[key] == d[key]
    assert d["--max_seq_len"] == "2560"                                     # prompt 2048 + output 512
    for args in (p, d):
        assert args["--kv_cache_type"] == "paged" and args["--max_beam_width"] == "1"
        assert args["--use_paged_context_fmha"] == "enable"
    assert "--paged_kv_cache" not in p                                      # deprecated flag
    assert d["--workers"] == "4"


def test_planned_manifest_records_exact_commands(request_for):
    plan = plan_build(request_for(prefill_tp=4, decode_tp=4))
    m = plan.decode.manifest
    assert m.status == "planned" and m.backend == "tensorrtllm"
    assert [s.argv for s in m.steps] == [plan.decode.checkpoint_step.argv, plan.decode.build_step.argv]
    assert m.versions["tensorrt_llm"] == "1.2.1" and m.versions["triton_container"] == "26.04"
    assert (m.build_config.tp_size, m.build_config.pp_size) == (4, 1)


def test_pp_in_folder_names(request_for):
    plan = plan_build(request_for(prefill_tp=2, decode_tp=2, decode_pp=2))
    assert plan.decode.engine_dir.name == "decode-tp2-pp2"
    assert plan.decode.checkpoint_step.output_dir.name == "fp8-tp2-pp2"
    assert args_of(plan.decode.build_step)["--workers"] == "4"
