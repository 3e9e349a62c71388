"""The GPU Triton model repository: `prefill` and `decode` on the tensorrtllm C++ backend.

Model names follow DESIGN.md for every backend: `prefill` and `decode` are TensorRT-LLM's context
and generation models; the BLS orchestrator (`disagg_bls`) is told their names through
`context_model_name` / `generation_model_name`. Each role model's config.pbtxt comes from
triton_models/tensorrtllm/config.pbtxt.tmpl; its `parameters` are checked against the options table.
"""

from __future__ import annotations

from trtpd.trtllm.mpi_world import RankLayout
from trtpd.trtllm.options import check_keys, require_valid
from trtpd.trtllm.options_table import required_backend_parameters
from trtpd.trtllm.plan import BuildPlan, RolePlan
from trtpd.errors import ConfigError
from trtpd.repo.render import ModelPlan

ROLE_TEMPLATE = "tensorrtllm"

# config.pbtxt `parameters` key -> template placeholder (the upstream placeholder names).
PARAMETER_PLACEHOLDERS = {
    "gpt_model_type": "batching_strategy", "gpt_model_path": "engine_dir",
    "FORCE_CPU_ONLY_INPUT_TENSORS": "force_cpu_only_input_tensors",
}


def role_parameters(plan: BuildPlan, role: RolePlan, world: RankLayout) -> dict[str, str]:
    """The tensorrtllm backend `parameters` for one role, as the strings the backend parses."""
    s = role.spec
    params = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str(role.engine_dir),
        "max_beam_width": str(s.max_beam_width),
        # s.kv_cache_max_tokens, the cap trtllm-serve gets as kv_cache_config.max_tokens; the executor uses the
        # smaller of it and the fraction. Empty (a role without one: prefill) is unset: ModelState::
        # GetParameter<int32_t> is std::stoi, which throws on "", and getKvCacheConfigFromParams catches that
        # and leaves the cap unset as for an absent key (TensorRT-LLM triton_backend/inflight_batcher_llm/src/
        # model_instance_state.cc@0c8de69, model_state.cc@5cdd692). The key is in the template for both roles.
        "max_tokens_in_paged_kv_cache": "" if s.kv_cache_max_tokens is None else str(s.kv_cache_max_tokens),
        "kv_cache_free_gpu_mem_fraction": f"{s.kv_cache_free_gpu_mem_fraction:g}",
        "kv_cache_onboard_blocks": "true",
        "enable_kv_cache_reuse": _bool(s.enable_kv_cache_reuse),
        "batch_scheduler_policy": s.batch_scheduler_policy,
        "enable_chunked_context": _bool(s.enable_chunked_context),
        # disagg_bls treats output_ids as generated tokens. Its sub-requests stream, and streamed responses carry
        # only new tokens whatever this says (LlmRequest::createResult, calculateNbTokensOut); "true" keeps that
        # so for a non-streamed request too.
        "exclude_input_in_output": "true",
        "normalize_log_probs": "true",
        "decoding_mode": "top_k_top_p",
        "multi_block_mode": _bool(s.multi_block_mode),
        "cuda_graph_mode": _bool(s.cuda_graph_mode),
        "cuda_graph_cache_size": str(s.cuda_graph_cache_size),
        "enable_context_fmha_fp32_acc": "false",
        "cancellation_check_period_ms": "100",
        "stats_check_period_ms": "100",
        "participant_ids": world.participant_ids(s.role),
        "gpu_device_ids": world.gpu_device_ids(s.role),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        # read with no fallback by getGuidedDecodingConfigFromParams: present, and empty because guided
        # decoding is off (the C++ path ignores tokenizer_dir anyway and logs that it does)
        "tokenizer_dir": "",
        "guided_decoding_backend": "",
        "xgrammar_tokenizer_info_path": "",
    }
    missing = [k for k in required_backend_parameters() if k not in params]
    if missing:
        raise ConfigError(f"{s.role} config.pbtxt would lack {', '.join(missing)}, which the tensorrtllm backend "
                          f"reads with no fallback (options_table.BACKEND_PARAMETERS)")
    require_valid(check_keys("tensorrtllm-config", params), f"{s.role} config.pbtxt parameters")
    return params


def role_model_plan(plan: BuildPlan, role: RolePlan, world: RankLayout) -> ModelPlan:
    s = role.spec
    values: dict[str, object] = {
        "triton_backend": "tensorrtllm",
        "triton_max_batch_size": s.max_batch_size,
        "decoupled_mode": plan.request.decoupled,
        "max_queue_delay_microseconds": s.max_queue_delay_microseconds,
        "max_queue_size": s.max_queue_size,
        "instance_count": s.instances,
        "logits_datatype": "TYPE_FP32",
    }
    require_valid(check_keys("tensorrtllm-config", {"backend": values["triton_backend"]}), f"{s.role} backend")
    for key, value in role_parameters(plan, role, world).items():
        values[PARAMETER_PLACEHOLDERS.get(key, key)] = value
    return ModelPlan(name=s.role, template=ROLE_TEMPLATE, values=values)


def plan_role_models(plan: BuildPlan, world: RankLayout) -> list[ModelPlan]:
    """`prefill` and `decode` only: the GPU-specific part of the repository."""
    return [role_model_plan(plan, role, world) for role in plan.roles]


def _bool(value: bool) -> str:
    return "true" if value else "false"
