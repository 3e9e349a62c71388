"""The KV-transfer staging buffer, sized for the longest prompt, on both paths.

TensorRT-LLM's C++ CacheTransceiver builds one CacheTransBufferManager for every backend, MPI included
(cpp/tensorrt_llm/batch_manager/cacheTransceiver.cpp, the 1.2-line constructor: the manager is made before
the backend switch). Its buffer size (cacheTransBuffer.cpp) is, per rank:
- with cache_transceiver_config.max_tokens_in_buffer: (that + one block) x this rank's KV bytes per token,
  summed over its layers (what both trtllm-serve paths set: serve_config.role_llm_options, serve_pytorch.role_options);
- without it: env TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE (cpp/tensorrt_llm/common/envUtils.cpp
  getEnvMemSizeForKVCacheTransferBuffer, default "512MB"; parseMemorySize takes a number with b/kb/mb/gb/tb,
  1024-based). The Triton backend hard-codes CacheTransceiverConfig(MPI) with no max_tokens_in_buffer
  (model_instance_state.cc getExecutorConfigFromParams), so there the environment variable is the setting.
A request whose KV does not fit falls back to buffers allocated per transfer (TensorRT-LLM's
disaggregated-service doc: "the performance of the cache transfer may be degraded"); a buffer much larger
than any prompt's KV is GPU memory taken outside the KV pool on every rank (send and receive buffers).
"""

from __future__ import annotations

import math

from trtpd.trtllm.plan import BuildPlan
from trtpd.trtllm.spec import BuildRequest, EngineRoleSpec

BUFFER_ENV = "TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE"
MIB = 1024 * 1024


def transfer_buffer_tokens(max_prompt_tokens: int, tokens_per_block: int) -> int:
    """Strictly above the longest prompt, by one KV block: equal is not enough under sustained load (Dynamo's
    TensorRT-LLM known issues, "KV Cache Exhaustion Causing Worker Deadlock": max_tokens_in_buffer must exceed
    the maximum ISL); cacheTransBuffer.cpp adds the same one block to max_tokens_in_buffer."""
    return max_prompt_tokens + tokens_per_block


def rank_kv_bytes_per_token(r: BuildRequest, spec: EngineRoleSpec) -> int:
    """One rank's KV bytes per token: the catalog's TP share (ModelSpec.kv_bytes_per_token_per_device) for the
    layers of its pipeline stage (the first stage holds the most)."""
    per_layer = r.model.kv_bytes_per_token_per_device(spec.tp_size, r.kv_dtype) // r.model.num_layers
    return per_layer * math.ceil(r.model.num_layers / spec.pp_size)


def transfer_buffer_bytes(plan: BuildPlan) -> int:
    """The longest prompt's KV (plus one block) held by one rank, for the role whose ranks hold the most."""
    r = plan.request
    tokens = transfer_buffer_tokens(r.max_input_len, r.tokens_per_block)
    return tokens * max(rank_kv_bytes_per_token(r, spec) for spec in r.roles)


def transfer_buffer_env(plan: BuildPlan) -> dict[str, str]:
    """{TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE: "<n>MB"}, rounded up to whole MiB (envUtils.cpp's "mb")."""
    return {BUFFER_ENV: f"{math.ceil(transfer_buffer_bytes(plan) / MIB)}MB"}
