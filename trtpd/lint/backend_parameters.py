"""The config.pbtxt `parameters` keys that TensorRT-LLM 1.2.1's tensorrtllm backend reads, and where.

Re-exported by trtpd.trtllm.options_table (the table of everything trtpd emits). A key without a fallback
is read with a bare GetParameter, which throws "Cannot find parameter with name: <key>", so the model
fails to load on every rank; such keys are always emitted, empty when unused, as upstream's template does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackendParameter:
    """A config.pbtxt `parameters` key that the 1.2.1 tensorrtllm backend reads, where, and what if it is absent."""

    name: str
    reader: str                 # file::function in triton_backend/inflight_batcher_llm/src/
    has_fallback: bool          # False: GetParameter throws "Cannot find parameter with name" and the model fails
    fallback: str = ""          # the value used when absent (has_fallback only)


# Read at TensorRT-LLM triton_backend/inflight_batcher_llm/src/model_instance_state.cc@0c8de69 and
# model_state.cc@5cdd692 (the stored versions; release/1.2.1 itself could not be fetched here, see
# trtllm-1.2.md §6). Every no-fallback key must be present, even when unused: then its value is "".
_MIS = "model_instance_state.cc::ModelInstanceState::"
BACKEND_PARAMETERS: tuple[BackendParameter, ...] = (
    BackendParameter("gpt_model_type", _MIS + "getBatchingTypeFromParams", False),
    BackendParameter("tokenizer_dir", _MIS + "getGuidedDecodingConfigFromParams", False),
    BackendParameter("xgrammar_tokenizer_info_path", _MIS + "getGuidedDecodingConfigFromParams", False),
    BackendParameter("guided_decoding_backend", _MIS + "getGuidedDecodingConfigFromParams", False),
    BackendParameter("gpt_model_path", _MIS + "ModelInstanceState (constructor)", True, "empty; then "
                     "'Both encoder and decoder model paths are empty' unless encoder_model_path is set"),
    BackendParameter("encoder_model_path", _MIS + "ModelInstanceState (constructor)", True, "empty"),
    BackendParameter("max_beam_width", _MIS + "getExecutorConfigFromParams", True, "1"),
    BackendParameter("iter_stats_max_iterations", _MIS + "getExecutorConfigFromParams", True, "executor default"),
    BackendParameter("request_stats_max_iterations", _MIS + "getExecutorConfigFromParams", True, "executor default"),
    BackendParameter("enable_trt_overlap", _MIS + "getExecutorConfigFromParams", True, "false"),
    BackendParameter("normalize_log_probs", _MIS + "getExecutorConfigFromParams", True, "true"),
    BackendParameter("enable_chunked_context", _MIS + "getExecutorConfigFromParams", True, "false"),
    BackendParameter("decoding_mode", _MIS + "getExecutorConfigFromParams", True, "top_k_top_p (beam width 1)"),
    BackendParameter("medusa_choices", _MIS + "getExecutorConfigFromParams", True, "mc_sim_7b_63"),
    BackendParameter("eagle_choices", _MIS + "getExecutorConfigFromParams", True, "none"),
    BackendParameter("gpu_weights_percent", _MIS + "getExecutorConfigFromParams", True, "1.0"),
    BackendParameter("recv_poll_period_ms", _MIS + "getExecutorConfigFromParams", True, "0 (busy loop)"),
    BackendParameter("max_tokens_in_paged_kv_cache", _MIS + "getKvCacheConfigFromParams", True, "unset"),
    BackendParameter("kv_cache_free_gpu_mem_fraction", _MIS + "getKvCacheConfigFromParams", True, "0.9"),
    BackendParameter("cross_kv_cache_fraction", _MIS + "getKvCacheConfigFromParams", True, "unset"),
    BackendParameter("kv_cache_host_memory_bytes", _MIS + "getKvCacheConfigFromParams", True, "0"),
    BackendParameter("kv_cache_onboard_blocks", _MIS + "getKvCacheConfigFromParams", True, "true"),
    BackendParameter("max_attention_window_size", _MIS + "getKvCacheConfigFromParams", True, "max_seq_len"),
    BackendParameter("sink_token_length", _MIS + "getKvCacheConfigFromParams", True, "unset"),
    BackendParameter("enable_kv_cache_reuse", _MIS + "getKvCacheConfigFromParams", True, "true"),
    BackendParameter("multi_block_mode", _MIS + "getExtendedRuntimePerfKnobConfigFromParams", True, "true"),
    BackendParameter("enable_context_fmha_fp32_acc", _MIS + "getExtendedRuntimePerfKnobConfigFromParams", True,
                     "false"),
    BackendParameter("cuda_graph_mode", _MIS + "getExtendedRuntimePerfKnobConfigFromParams", True, "false"),
    BackendParameter("cuda_graph_cache_size", _MIS + "getExtendedRuntimePerfKnobConfigFromParams", True, "0"),
    BackendParameter("num_nodes", _MIS + "getParallelConfigFromParams", True, "1"),
    BackendParameter("lora_cache_max_adapter_size", _MIS + "getPeftCacheConfigFromParams", True, "64"),
    BackendParameter("lora_cache_optimal_adapter_size", _MIS + "getPeftCacheConfigFromParams", True, "8"),
    BackendParameter("lora_cache_gpu_memory_fraction", _MIS + "getPeftCacheConfigFromParams", True, "0.05"),
    BackendParameter("lora_cache_host_memory_bytes", _MIS + "getPeftCacheConfigFromParams", True, "1 GB"),
    BackendParameter("lora_prefetch_dir", _MIS + "getPeftCacheConfigFromParams", True, "unset"),
    BackendParameter("batch_scheduler_policy", _MIS + "getSchedulerConfigFromParams", True, "guaranteed_no_evict"),
    BackendParameter("speculative_decoding_fast_logits", _MIS + "getSpeculativeDecodingConfigFromParams", True,
                     "false"),
    BackendParameter("lookahead_window_size", _MIS + "getExecutorConfigFromParams", True,
                     "none; required (throws) only when decoding_mode is lookahead"),
    BackendParameter("exclude_input_in_output", _MIS + "ModelInstanceState (constructor)", True, "false"),
    BackendParameter("cancellation_check_period_ms", _MIS + "ModelInstanceState (constructor)", True, "100"),
    BackendParameter("stats_check_period_ms", _MIS + "ModelInstanceState (constructor)", True, "100"),
    BackendParameter("gpu_device_ids", "model_state.cc::ModelState::LoadParameters", True, "all visible GPUs"),
    BackendParameter("participant_ids", "model_state.cc::ModelState::LoadParameters", True,
                     "none; then getParallelConfigFromParams throws when spawning is off in orchestrator mode"),
    BackendParameter("executor_worker_path", "model_state.cc::ModelState::GetExecutorWorkerPath", True,
                     "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"),
)


def required_backend_parameters() -> tuple[str, ...]:
    """The keys an instance cannot load without (every rank, worker ranks included)."""
    return tuple(p.name for p in BACKEND_PARAMETERS if not p.has_fallback)
