"""TensorRT-LLM 1.2.x options that trtpd may emit: flag or key, type, allowed values, default, source.

Every command, config.pbtxt parameter and YAML key that trtpd writes is checked against this table
(`trtpd.trtllm.options`). Sources are sections of ../shared/reference/trtllm-1.2.md followed by the
upstream file that section cites, or, for what that file does not cover (the PyTorch backend's keys, ModelOpt's
hf_ptq.py), the upstream file itself as read: `NVIDIA/<repo> <path>@<commit>`, or `(id N)` for a stored version
whose commit the index does not reveal (docs/gpu-build.md, "PyTorch backend"). A flag that is not here, or is
here as deprecated, cannot be emitted.
Types: int, float, bool ("true"/"false"), switch ("enable"/"disable"), flag (no value), enum, str, path,
memsize (a number and b/kb/mb/gb/tb, as TensorRT-LLM's parseMemorySize reads it).
"""

from __future__ import annotations

from dataclasses import dataclass

# The parameter table of the 1.2.1 tensorrtllm backend (each key, where the backend reads it, whether it has a
# fallback) is part of this table; its data lives in trtpd.lint.backend_parameters because the repository lint
# checks hand-edited repositories against it, and lint importing build would close a build<->lint cycle.
from trtpd.lint.backend_parameters import BACKEND_PARAMETERS, BackendParameter, required_backend_parameters

__all__ = ["BACKEND_PARAMETERS", "OPTIONS", "TOOLS", "BackendParameter", "TrtllmOption", "options_for",
           "required_backend_parameters"]


@dataclass(frozen=True)
class TrtllmOption:
    tool: str
    name: str
    type: str
    allowed: tuple[str, ...] | None = None
    default: str | None = None
    source: str = ""
    deprecated: str | None = None        # why it must not be emitted, and what to use instead
    min_value: float | None = None
    max_value: float | None = None       # e.g. a key the backend parses into int32 (std::stoi)
    empty_ok: bool = False               # "" is a valid value (an unused parameter the backend still reads)


_SW = ("enable", "disable")
_BUILD = "trtllm-1.2.md §1.1; TensorRT-LLM tensorrt_llm/commands/build.py@65f1d15 (defaults: builder.py@47cb03a)"
_PLUGIN = "trtllm-1.2.md §1.1; TensorRT-LLM tensorrt_llm/plugin/plugin.py@c20322f"
_QUANT = "trtllm-1.2.md §1.2 A; TensorRT-LLM examples/quantization/quantize.py@c8c6df0"
_CONVERT = "trtllm-1.2.md §1.2 B; TensorRT-LLM examples/models/core/llama/convert_checkpoint.py@368f8f2"
_PBTXT = ("trtllm-1.2.md §3.3; TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/"
          "config.pbtxt@0c8de69 and model_instance_state.cc@c8c6df0")
_KVCAP = ("trtllm-1.2.md §3.3; TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/"
          "config.pbtxt@0c8de69 (${max_tokens_in_paged_kv_cache}), triton_backend/inflight_batcher_llm/src/"
          "model_instance_state.cc@0c8de69 ModelInstanceState::getKvCacheConfigFromParams (try/catch: unset) and "
          "model_state.cc@5cdd692 ModelState::GetParameter<int32_t> (std::stoi)")
_LAUNCH = "trtllm-1.2.md §3.5; TensorRT-LLM triton_backend/scripts/launch_triton_server.py@0a2e2c1"
_SERVE = "trtllm-1.2.md §2.3; TensorRT-LLM tensorrt_llm/commands/serve.py@4c05a74"
_LLMARGS = "trtllm-1.2.md §1.3; TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (id 1090804222)"
_CTC = "trtllm-1.2.md §2.1; TensorRT-LLM tensorrt_llm/llmapi/llm_args.py CacheTransceiverConfig (id 1090804222)"
_DISAGG = "trtllm-1.2.md §2.3; TensorRT-LLM tensorrt_llm/llmapi/disagg_utils.py@0228a71"
# The PyTorch backend (trtllm-serve --backend pytorch; trtllm/serve_pytorch.py). llm_args.py id 1090804222 is the
# ~Nov 2025 main version, before the release/1.2 cut (the facts behind docs/serve-twin.md bracket 1.2.1 by it).
_TORCH = ("trtllm-1.2.md §1.3; NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py TorchLlmArgs, KvCacheConfig "
          "(id 1090804222)")
_TORCH_SIZES = ("trtllm-1.2.md §1.3; NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py BaseLlmArgs and "
                "update_llm_args_with_extra_dict: YAML max_batch_size/max_num_tokens are copied into the build_config "
                "trtllm-serve makes from its flags (id 1090804222); commands/serve.py get_llm_args (id 901178132)")
_TORCH_KV_DTYPE = ("trtllm-1.2.md §1.3; NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/model_loader.py "
                   "validate_and_set_kv_cache_quant: fp8, nvfp4 or auto (the checkpoint's), a value other than the "
                   "checkpoint's kv_cache_quant_algo raises (id 3418473958)")
_OVERLAP = ("NVIDIA/TensorRT-LLM examples/disaggregated/README.md@c3c3d76 (context servers: the overlap scheduler "
            "'is not yet supported in disaggregated context server architectures'); llm_args.py "
            "TorchLlmArgs.disable_overlap_scheduler (id 1090804222)")
_ITER_STATS = ("NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py TorchLlmArgs.enable_iter_perf_stats "
               "(id 1090804222); serve/openai_server.py get_iteration_stats serves them at /metrics (id 456200087)")
_PERF_METRICS = ("NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py BaseLlmArgs.return_perf_metrics (bool, False) and "
                 "perf_metrics_max_requests (int, 0) (id 1090804222); serve/openai_server.py keeps a deque of that "
                 "many per-request records, handed out once at GET /perf_metrics, only when both are set "
                 "(__init__, _extract_metrics, get_perf_metrics; id 456200087)")
_CLUSTER = ("trtllm-1.2.md §2.3; NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/disagg_utils.py DisaggClusterConfig, "
            "MinimalInstances, extract_disagg_cluster_config (id 103242683)")
_WORKER_CLUSTER = (_CLUSTER + "; commands/serve.py pops a top-level disagg_cluster from the worker's YAML before the "
                   "rest become LLM args (id 901178132)")
_SERVE_ROLE = ("trtllm-1.2.md §2.3; NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py --server_role "
               "(ServerRole[value.upper()]), --disagg_cluster_uri (id 901178132)")
_HF_PTQ = ("NVIDIA/TensorRT-Model-Optimizer examples/llm_ptq/hf_ptq.py@df0882a (tag 0.37.0; README.md 'Quantize "
           "and Export': a unified Hugging Face checkpoint TensorRT-LLM's PyTorch backend loads); TensorRT-LLM 1.2.x "
           "requires nvidia-modelopt[torch]~=0.37.0")
_HF_DOWNLOAD = ("huggingface/huggingface_hub src/huggingface_hub/commands/download.py (id 491274864; `hf download "
                "REPO --local-dir DIR`, the same flag in the later cli/download.py, id 20878559034); the `hf` CLI of "
                "huggingface_hub 0.34+, which TensorRT-LLM 1.2.1's transformers 4.57 requires")
_GUIDED = ("trtllm-1.2.md §6; TensorRT-LLM triton_backend/inflight_batcher_llm/src/model_instance_state.cc@0c8de69 "
           "ModelInstanceState::getGuidedDecodingConfigFromParams (read with no try/catch)")
_UCX = ("trtllm-1.2.md §5-6; TensorRT-LLM docs/source/advanced/disaggregated-service.md@295c31f (UCX_MEMTYPE_CACHE=n, "
        "#2518) and tensorrt_llm/_torch/pyexecutor/kv_cache_transceiver.py create_kv_cache_transceiver (UCX log "
        "line: devices not in one NVLink domain -> UCX_CUDA_IPC_ENABLE_MNNVL=n, UCX_RNDV_SCHEME=put_zcopy)")

_KVBUF = ("trtllm-1.2.md §2.2; TensorRT-LLM cpp/tensorrt_llm/common/envUtils.cpp getEnvMemSizeForKVCacheTransferBuffer "
          "(parseMemorySize: a number, then b, kb, mb, gb or tb) and batch_manager/cacheTransBuffer.cpp (read when "
          "max_tokens_in_buffer is unset, any transport); docs/source/advanced/disaggregated-service.md")

_DTYPES = ("auto", "float16", "float32", "bfloat16", "int32", "disable")

OPTIONS: tuple[TrtllmOption, ...] = (
    # trtllm-build: sizes
    TrtllmOption("trtllm-build", "--checkpoint_dir", "path", None, None, _BUILD),
    TrtllmOption("trtllm-build", "--output_dir", "path", None, "engine_outputs", _BUILD),
    TrtllmOption("trtllm-build", "--max_batch_size", "int", None, "2048", _BUILD, min_value=1),
    TrtllmOption("trtllm-build", "--max_input_len", "int", None, "1024", _BUILD, min_value=1),
    TrtllmOption("trtllm-build", "--max_seq_len", "int", None, None, _BUILD, min_value=1),
    TrtllmOption("trtllm-build", "--max_beam_width", "int", None, "1", _BUILD, min_value=1),
    TrtllmOption("trtllm-build", "--max_num_tokens", "int", None, "8192", _BUILD, min_value=1),
    TrtllmOption("trtllm-build", "--kv_cache_type", "enum", ("continuous", "paged", "disabled"), "paged", _BUILD),
    TrtllmOption("trtllm-build", "--workers", "int", None, "1", _BUILD, min_value=1),
    TrtllmOption("trtllm-build", "--log_level", "str", None, "info", _BUILD),
    TrtllmOption("trtllm-build", "--paged_kv_cache", "switch", _SW, None, _BUILD,
                 deprecated="build.py logs 'use --kv_cache_type=paged/disabled instead'; emit --kv_cache_type"),
    TrtllmOption("trtllm-build", "--opt_num_tokens", "int", None, None, _BUILD),
    # trtllm-build: plugins and features
    TrtllmOption("trtllm-build", "--gpt_attention_plugin", "enum", _DTYPES, "auto", _PLUGIN),
    TrtllmOption("trtllm-build", "--gemm_plugin", "enum", _DTYPES[:-1] + ("fp8", "nvfp4", "disable"), None, _PLUGIN),
    TrtllmOption("trtllm-build", "--context_fmha", "switch", _SW, "enable", _PLUGIN),
    TrtllmOption("trtllm-build", "--remove_input_padding", "switch", _SW, "enable", _PLUGIN),
    TrtllmOption("trtllm-build", "--tokens_per_block", "int", None, "32", _PLUGIN, min_value=1),
    TrtllmOption("trtllm-build", "--use_paged_context_fmha", "switch", _SW, "enable", _PLUGIN),
    TrtllmOption("trtllm-build", "--use_fp8_context_fmha", "switch", _SW, "enable", _PLUGIN),
    TrtllmOption("trtllm-build", "--multiple_profiles", "switch", _SW, "disable", _PLUGIN),
    TrtllmOption("trtllm-build", "--use_fused_mlp", "switch", _SW, "enable", _PLUGIN),
    TrtllmOption("trtllm-build", "--context_fmha_fp32_acc", "switch", _SW, None, _PLUGIN,
                 deprecated="renamed to --bert_context_fmha_fp32_acc"),
    # quantize.py (ModelOpt PTQ): FP8 weights and FP8 KV
    TrtllmOption("quantize.py", "--model_dir", "path", None, None, _QUANT),
    TrtllmOption("quantize.py", "--dtype", "enum", ("auto", "float16", "bfloat16", "float32"), "auto", _QUANT),
    TrtllmOption("quantize.py", "--qformat", "enum", ("nvfp4", "fp8", "int8_sq", "int4_awq", "w4a8_awq",
                                                      "int8_wo", "int4_wo", "full_prec"), "full_prec", _QUANT),
    TrtllmOption("quantize.py", "--kv_cache_dtype", "enum", ("fp8", "int8"), None, _QUANT),
    TrtllmOption("quantize.py", "--calib_size", "int", None, "512", _QUANT, min_value=1),
    TrtllmOption("quantize.py", "--calib_dataset", "str", None, "cnn_dailymail", _QUANT),
    TrtllmOption("quantize.py", "--batch_size", "int", None, "1", _QUANT, min_value=1),
    TrtllmOption("quantize.py", "--calib_max_seq_length", "int", None, "512", _QUANT, min_value=1),
    TrtllmOption("quantize.py", "--tp_size", "int", None, "1", _QUANT, min_value=1),
    TrtllmOption("quantize.py", "--pp_size", "int", None, "1", _QUANT, min_value=1),
    TrtllmOption("quantize.py", "--output_dir", "path", None, "exported_model", _QUANT),
    TrtllmOption("quantize.py", "--seed", "int", None, "1234", _QUANT),
    # convert_checkpoint.py (no quantization: the FP8-off path)
    TrtllmOption("convert_checkpoint.py", "--model_dir", "path", None, None, _CONVERT),
    TrtllmOption("convert_checkpoint.py", "--output_dir", "path", None, "tllm_checkpoint", _CONVERT),
    TrtllmOption("convert_checkpoint.py", "--dtype", "enum", ("auto", "float32", "bfloat16", "float16"), "auto", _CONVERT),
    TrtllmOption("convert_checkpoint.py", "--tp_size", "int", None, "1", _CONVERT, min_value=1),
    TrtllmOption("convert_checkpoint.py", "--pp_size", "int", None, "1", _CONVERT, min_value=1),
    TrtllmOption("convert_checkpoint.py", "--workers", "int", None, "1", _CONVERT, min_value=1),
    TrtllmOption("convert_checkpoint.py", "--use_fp8", "flag", None, "false", _CONVERT),
    TrtllmOption("convert_checkpoint.py", "--fp8_kv_cache", "flag", None, "false", _CONVERT),
    # Triton tensorrtllm backend: config.pbtxt `backend` and `parameters` keys
    TrtllmOption("tensorrtllm-config", "backend", "enum", ("tensorrtllm",), None, _PBTXT),
    TrtllmOption("tensorrtllm-config", "gpt_model_type", "enum",
                 ("inflight_fused_batching", "inflight_batching", "V1", "v1"), None, _PBTXT),
    TrtllmOption("tensorrtllm-config", "gpt_model_path", "path", None, None, _PBTXT),
    TrtllmOption("tensorrtllm-config", "max_beam_width", "int", None, "1", _PBTXT, min_value=1),
    # The KV pool's token cap (unset by default: the fraction alone). getKvCacheConfigFromParams reads it with
    # GetParameter<int32_t> (std::stoi) inside try/catch: "" or absent -> unset; beyond int32 stoi throws
    # out_of_range and the cap is dropped with only the "not specified" warning, hence max_value. Both set: the
    # smaller pool wins.
    TrtllmOption("tensorrtllm-config", "max_tokens_in_paged_kv_cache", "int", None, None, _KVCAP, min_value=1,
                 max_value=2**31 - 1, empty_ok=True),
    TrtllmOption("tensorrtllm-config", "kv_cache_free_gpu_mem_fraction", "float", None, "0.9", _PBTXT, min_value=0),
    TrtllmOption("tensorrtllm-config", "enable_kv_cache_reuse", "bool", ("true", "false"), "true", _PBTXT),
    TrtllmOption("tensorrtllm-config", "batch_scheduler_policy", "enum",
                 ("guaranteed_no_evict", "max_utilization"), "guaranteed_no_evict", _PBTXT),
    TrtllmOption("tensorrtllm-config", "enable_chunked_context", "bool", ("true", "false"), "false", _PBTXT),
    TrtllmOption("tensorrtllm-config", "exclude_input_in_output", "bool", ("true", "false"), "false", _PBTXT),
    TrtllmOption("tensorrtllm-config", "normalize_log_probs", "bool", ("true", "false"), "true", _PBTXT),
    TrtllmOption("tensorrtllm-config", "cancellation_check_period_ms", "int", None, "100", _PBTXT, min_value=1),
    TrtllmOption("tensorrtllm-config", "stats_check_period_ms", "int", None, "100", _PBTXT, min_value=1),
    TrtllmOption("tensorrtllm-config", "gpu_device_ids", "str", None, "all visible", _PBTXT),
    TrtllmOption("tensorrtllm-config", "participant_ids", "str", None, "auto", _PBTXT),
    TrtllmOption("tensorrtllm-config", "decoding_mode", "enum",
                 ("top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle"),
                 "top_k_top_p", _PBTXT),
    TrtllmOption("tensorrtllm-config", "multi_block_mode", "bool", ("true", "false"), "true", _PBTXT),
    TrtllmOption("tensorrtllm-config", "cuda_graph_mode", "bool", ("true", "false"), "false", _PBTXT),
    TrtllmOption("tensorrtllm-config", "cuda_graph_cache_size", "int", None, "0", _PBTXT, min_value=0),
    TrtllmOption("tensorrtllm-config", "enable_context_fmha_fp32_acc", "bool", ("true", "false"), "false", _PBTXT),
    TrtllmOption("tensorrtllm-config", "kv_cache_onboard_blocks", "bool", ("true", "false"), "true", _PBTXT),
    TrtllmOption("tensorrtllm-config", "FORCE_CPU_ONLY_INPUT_TENSORS", "enum", ("no",), "no", _PBTXT),
    TrtllmOption("tensorrtllm-config", "tokenizer_dir", "str", None, "", _GUIDED, empty_ok=True),
    TrtllmOption("tensorrtllm-config", "guided_decoding_backend", "enum", ("", "xgrammar"), "", _GUIDED,
                 empty_ok=True),
    TrtllmOption("tensorrtllm-config", "xgrammar_tokenizer_info_path", "str", None, "", _GUIDED, empty_ok=True),
    TrtllmOption("tensorrtllm-config", "worker_path", "path", None, None, _PBTXT,
                 deprecated="rejected by the backend; executor_worker_path is hard-coded"),
    # One MPI world for the Triton C++ backend (orchestrator + context + generation ranks)
    TrtllmOption("mpirun", "--allow-run-as-root", "flag", None, None, _LAUNCH),
    TrtllmOption("mpirun", "-n", "int", None, None, _LAUNCH, min_value=1),
    TrtllmOption("mpirun", "-x", "str", None, None, _LAUNCH),
    TrtllmOption("tritonserver", "--model-repository", "path", None, None, _LAUNCH),
    TrtllmOption("tritonserver", "--http-port", "int", None, "8000", _LAUNCH, min_value=1),
    TrtllmOption("tritonserver", "--grpc-port", "int", None, "8001", _LAUNCH, min_value=1),
    TrtllmOption("tritonserver", "--metrics-port", "int", None, "8002", _LAUNCH, min_value=1),
    TrtllmOption("tritonserver", "--disable-auto-complete-config", "flag", None, None, _LAUNCH),
    TrtllmOption("tritonserver", "--backend-config", "str", None, None, _LAUNCH),
    TrtllmOption("tritonserver", "--model-control-mode", "enum", ("explicit",), None, _LAUNCH),
    TrtllmOption("tritonserver", "--load-model", "str", None, None, _LAUNCH),
    TrtllmOption("env", "TRTLLM_ORCHESTRATOR", "enum", ("1",), None, _LAUNCH),
    TrtllmOption("env", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES", "enum", ("0", "1"), None, _LAUNCH),
    TrtllmOption("env", "TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE", "memsize", None, "512MB", _KVBUF),
    # UCX for the trtllm-serve KV transceiver (cache_transceiver_config.backend UCX, or NIXL over UCX)
    TrtllmOption("env", "UCX_MEMTYPE_CACHE", "enum", ("n", "y"), "y", _UCX),
    TrtllmOption("env", "UCX_CUDA_IPC_ENABLE_MNNVL", "enum", ("n", "y"), None, _UCX),
    TrtllmOption("env", "UCX_RNDV_SCHEME", "enum", ("put_zcopy", "get_zcopy", "auto"), "auto", _UCX),
    # trtllm-serve workers and the disaggregated router
    TrtllmOption("trtllm-serve", "--tokenizer", "path", None, None, _SERVE),
    TrtllmOption("trtllm-serve", "--host", "str", None, "localhost", _SERVE),
    TrtllmOption("trtllm-serve", "--port", "int", None, "8000", _SERVE, min_value=1),
    TrtllmOption("trtllm-serve", "--backend", "enum", ("pytorch", "tensorrt", "_autodeploy"), "pytorch", _SERVE),
    TrtllmOption("trtllm-serve", "--max_beam_width", "int", None, "1", _SERVE, min_value=1),
    TrtllmOption("trtllm-serve", "--max_batch_size", "int", None, "2048", _SERVE, min_value=1),
    TrtllmOption("trtllm-serve", "--max_num_tokens", "int", None, "8192", _SERVE, min_value=1),
    TrtllmOption("trtllm-serve", "--max_seq_len", "int", None, None, _SERVE, min_value=1),
    TrtllmOption("trtllm-serve", "--tp_size", "int", None, "1", _SERVE, min_value=1),
    TrtllmOption("trtllm-serve", "--pp_size", "int", None, "1", _SERVE, min_value=1),
    TrtllmOption("trtllm-serve", "--kv_cache_free_gpu_memory_fraction", "float", None, "0.9", _SERVE, min_value=0),
    TrtllmOption("trtllm-serve", "--extra_llm_api_options", "path", None, None, _SERVE),
    TrtllmOption("trtllm-serve", "--log_level", "str", None, "info", _SERVE),
    TrtllmOption("trtllm-serve", "--server_role", "enum", ("CONTEXT", "GENERATION", "MM_ENCODER"), None, _SERVE_ROLE),
    TrtllmOption("trtllm-serve", "--disagg_cluster_uri", "str", None, None, _SERVE_ROLE),
    TrtllmOption("trtllm-serve disaggregated", "-c", "path", None, None, _SERVE),
    TrtllmOption("trtllm-serve disaggregated", "-t", "int", None, "180", _SERVE, min_value=1),
    TrtllmOption("trtllm-serve disaggregated", "-r", "int", None, "180", _SERVE, min_value=1),
    # --extra_llm_api_options YAML (LLM API args; dotted keys are nested)
    TrtllmOption("llm-api-options", "kv_cache_config.enable_block_reuse", "bool", ("true", "false"), "true", _LLMARGS),
    TrtllmOption("llm-api-options", "kv_cache_config.free_gpu_memory_fraction", "float", None, "0.9", _LLMARGS,
                 min_value=0),
    TrtllmOption("llm-api-options", "kv_cache_config.dtype", "enum", ("auto",), "auto", _LLMARGS),
    # "If both max_tokens and free_gpu_memory_fraction are specified, memory corresponding to the minimum will be used"
    TrtllmOption("llm-api-options", "kv_cache_config.max_tokens", "int", None, None, _LLMARGS, min_value=1),
    TrtllmOption("llm-api-options", "enable_chunked_prefill", "bool", ("true", "false"), "false", _LLMARGS),
    TrtllmOption("llm-api-options", "extended_runtime_perf_knob_config.multi_block_mode", "bool",
                 ("true", "false"), "true", _LLMARGS),
    TrtllmOption("llm-api-options", "extended_runtime_perf_knob_config.enable_context_fmha_fp32_acc", "bool",
                 ("true", "false"), "false", _LLMARGS),
    TrtllmOption("llm-api-options", "extended_runtime_perf_knob_config.cuda_graph_mode", "bool",
                 ("true", "false"), "false", _LLMARGS),
    TrtllmOption("llm-api-options", "extended_runtime_perf_knob_config.cuda_graph_cache_size", "int", None, "0",
                 _LLMARGS, min_value=0),
    TrtllmOption("llm-api-options", "cache_transceiver_config.backend", "enum", ("DEFAULT", "UCX", "NIXL", "MPI"),
                 None, _CTC),
    TrtllmOption("llm-api-options", "cache_transceiver_config.max_tokens_in_buffer", "int", None, None, _CTC,
                 min_value=1),
    TrtllmOption("llm-api-options", "cache_transceiver_config.kv_transfer_timeout_ms", "int", None, None, _CTC,
                 min_value=1),
    TrtllmOption("disagg-config", "hostname", "str", None, "localhost", _DISAGG),
    TrtllmOption("disagg-config", "port", "int", None, "8000", _DISAGG, min_value=1),
    TrtllmOption("disagg-config", "max_retries", "int", None, "1", _DISAGG, min_value=0),
    TrtllmOption("disagg-config", "context_servers.num_instances", "int", None, "1", _DISAGG, min_value=1),
    TrtllmOption("disagg-config", "context_servers.urls", "list", None, None, _DISAGG),
    TrtllmOption("disagg-config", "generation_servers.num_instances", "int", None, "1", _DISAGG, min_value=1),
    TrtllmOption("disagg-config", "generation_servers.urls", "list", None, None, _DISAGG),
    # disagg_cluster instead of urls: workers register with the router (an http:// cluster_uri is the router itself)
    TrtllmOption("disagg-config", "disagg_cluster.cluster_uri", "str", None, None, _CLUSTER),
    TrtllmOption("disagg-config", "disagg_cluster.cluster_name", "str", None, "", _CLUSTER, empty_ok=True),
    TrtllmOption("disagg-config", "disagg_cluster.minimal_instances.context_servers", "int", None, "1", _CLUSTER,
                 min_value=1),
    TrtllmOption("disagg-config", "disagg_cluster.minimal_instances.generation_servers", "int", None, "1", _CLUSTER,
                 min_value=1),
    TrtllmOption("disagg-config", "disagg_cluster.heartbeat_interval_sec", "int", None, "5", _CLUSTER, min_value=1),
    TrtllmOption("disagg-config", "disagg_cluster.inactive_timeout_sec", "int", None, "10", _CLUSTER, min_value=1),
    # --extra_llm_api_options YAML of a PyTorch-backend server (TorchLlmArgs: StrictBaseModel, unknown keys refused;
    # extended_runtime_perf_knob_config is TrtLlmArgs-only, so it is not here)
    TrtllmOption("torch-llm-api-options", "max_batch_size", "int", None, "2048", _TORCH_SIZES, min_value=1),
    TrtllmOption("torch-llm-api-options", "max_num_tokens", "int", None, "8192", _TORCH_SIZES, min_value=1),
    TrtllmOption("torch-llm-api-options", "enable_chunked_prefill", "bool", ("true", "false"), "false", _TORCH),
    TrtllmOption("torch-llm-api-options", "disable_overlap_scheduler", "bool", ("true", "false"), "false", _OVERLAP),
    TrtllmOption("torch-llm-api-options", "enable_iter_perf_stats", "bool", ("true", "false"), "false", _ITER_STATS),
    TrtllmOption("torch-llm-api-options", "return_perf_metrics", "bool", ("true", "false"), "false", _PERF_METRICS),
    TrtllmOption("torch-llm-api-options", "perf_metrics_max_requests", "int", None, "0", _PERF_METRICS,
                 min_value=0),
    TrtllmOption("torch-llm-api-options", "kv_cache_config.enable_block_reuse", "bool", ("true", "false"), "true",
                 _TORCH),
    TrtllmOption("torch-llm-api-options", "kv_cache_config.free_gpu_memory_fraction", "float", None, "0.9", _TORCH,
                 min_value=0, max_value=1),
    TrtllmOption("torch-llm-api-options", "kv_cache_config.tokens_per_block", "int", None, "32", _TORCH, min_value=1),
    TrtllmOption("torch-llm-api-options", "kv_cache_config.dtype", "enum", ("auto", "fp8", "nvfp4"), "auto",
                 _TORCH_KV_DTYPE),
    TrtllmOption("torch-llm-api-options", "kv_cache_config.max_tokens", "int", None, None, _TORCH, min_value=1),
    TrtllmOption("torch-llm-api-options", "cache_transceiver_config.backend", "enum", ("DEFAULT", "UCX", "NIXL", "MPI"),
                 None, _CTC),
    TrtllmOption("torch-llm-api-options", "cache_transceiver_config.max_tokens_in_buffer", "int", None, None, _CTC,
                 min_value=1),
    TrtllmOption("torch-llm-api-options", "cache_transceiver_config.kv_transfer_timeout_ms", "int", None, None, _CTC,
                 min_value=1),
    TrtllmOption("torch-llm-api-options", "disagg_cluster.cluster_uri", "str", None, None, _WORKER_CLUSTER),
    TrtllmOption("torch-llm-api-options", "disagg_cluster.cluster_name", "str", None, "", _WORKER_CLUSTER,
                 empty_ok=True),
    TrtllmOption("torch-llm-api-options", "disagg_cluster.heartbeat_interval_sec", "int", None, "5", _WORKER_CLUSTER,
                 min_value=1),
    TrtllmOption("torch-llm-api-options", "disagg_cluster.inactive_timeout_sec", "int", None, "10", _WORKER_CLUSTER,
                 min_value=1),
    # ModelOpt's PTQ for the PyTorch backend: one calibration, a unified Hugging Face checkpoint (hf_quant_config.json)
    TrtllmOption("hf_ptq.py", "--pyt_ckpt_path", "path", None, None, _HF_PTQ),
    TrtllmOption("hf_ptq.py", "--qformat", "enum", ("fp8", "int8", "int8_sq", "int4_awq", "w4a8_awq", "nvfp4",
                                                    "nvfp4_awq", "fp8_pb_wo", "fp8_pc_pt", "w4a8_nvfp4_fp8",
                                                    "w4a8_mxfp4_fp8", "nvfp4_mlp_only"), "fp8", _HF_PTQ),
    TrtllmOption("hf_ptq.py", "--kv_cache_qformat", "enum", ("none", "fp8", "nvfp4", "nvfp4_affine"), "fp8", _HF_PTQ),
    TrtllmOption("hf_ptq.py", "--calib_size", "int", None, "512", _HF_PTQ, min_value=1),
    TrtllmOption("hf_ptq.py", "--dataset", "str", None, None, _HF_PTQ),
    TrtllmOption("hf_ptq.py", "--export_path", "path", None, "exported_model", _HF_PTQ),
    # a hub model for the PyTorch servers, fetched once (tokenizer_files.py: the servers download nothing)
    TrtllmOption("hf download", "--local-dir", "path", None, None, _HF_DOWNLOAD),
)


def options_for(tool: str) -> dict[str, TrtllmOption]:
    return {o.name: o for o in OPTIONS if o.tool == tool}


TOOLS: tuple[str, ...] = tuple(dict.fromkeys(o.tool for o in OPTIONS))
