"""What to build: recipes + command-line overrides, resolved and validated before anything is written.

Every check here names the flag at fault and the fix, and runs before the first file or command,
so bad input leaves nothing behind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from trtpd.trtllm.recipe import Recipes, RoleRecipe
from trtpd.catalog import KvDtype, ModelSpec, resolve_model
from trtpd.errors import ConfigError

MAX_RECOMMENDED_NUM_TOKENS = 16384      # trtllm-build warns above this (builder.check_max_num_tokens)
GIB = 1024 ** 3

# Sizes a recipe may leave to trtpd ("auto"/"batch"); the reasoning is in recipes/tensorrtllm/*.yaml.
MAX_PREFILL_BATCH_SIZE = 256            # the planner's cap on a prefill batch too (planner/candidates.py)
CUDA_GRAPH_MIB = 10                     # upper end of "one graph is 4-10MB of GPU memory" (TensorRT-LLM
                                        # batch_manager/trtGptModelInflightBatching.cpp, where the cache is made)
CUDA_GRAPH_BUDGET_MIB = 640             # trtpd's budget for captured decode graphs, per runtime buffer


def auto_prefill_batch_size(max_num_tokens: int, tokens_per_block: int) -> int:
    """So that the token budget, not the request count, ends a context batch for any prompt of a KV block or more."""
    return max(1, min(MAX_PREFILL_BATCH_SIZE, max_num_tokens // tokens_per_block))


def auto_cuda_graph_cache_size(max_batch_size: int) -> int:
    """Graphs within CUDA_GRAPH_BUDGET_MIB; the runtime keeps at most max_batch_size anyway (min(maxBatchSize,
    cudaGraphCacheSize) in trtGptModelInflightBatching.cpp)."""
    return min(max_batch_size, CUDA_GRAPH_BUDGET_MIB // CUDA_GRAPH_MIB)


def batch_kv_tokens(max_batch_size: int, max_seq_len: int, tokens_per_block: int) -> int:
    """The most KV that guaranteed_no_evict ever reserves: each of max_batch_size requests reserves at most
    ceil(max_seq_len / tokens_per_block) blocks (KVCacheManager::getRemainingBlocksToCompletion reserves
    ceil(min(prompt + max_new_tokens, window) / tokens_per_block))."""
    return max_batch_size * math.ceil(max_seq_len / tokens_per_block) * tokens_per_block


@dataclass(frozen=True)
class EngineRoleSpec:
    role: str
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_num_tokens: int
    max_input_len: int
    max_seq_len: int
    max_beam_width: int
    kv_cache_free_gpu_mem_fraction: float
    kv_cache_max_tokens: int | None         # None: the fraction alone sizes the KV pool
    enable_kv_cache_reuse: bool
    batch_scheduler_policy: str
    enable_chunked_context: bool
    cuda_graph_mode: bool
    cuda_graph_cache_size: int
    multi_block_mode: bool
    max_queue_delay_microseconds: int
    max_queue_size: int
    instances: int

    @property
    def gpus_per_instance(self) -> int:
        return self.tp_size * self.pp_size


@dataclass(frozen=True)
class BuildOverrides:
    """Command-line values; None means 'take the recipe's'."""

    prefill_tp: int | None = None
    decode_tp: int | None = None
    prefill_pp: int | None = None
    decode_pp: int | None = None
    prefill_max_batch_size: int | None = None
    decode_max_batch_size: int | None = None
    prefill_max_num_tokens: int | None = None
    decode_max_num_tokens: int | None = None
    prefill_instances: int | None = None
    decode_instances: int | None = None
    max_input_len: int | None = None
    max_output_len: int | None = None
    tokens_per_block: int | None = None
    fp8: bool | None = None
    weights_dtype: str | None = None
    transceiver_backend: str | None = None
    kv_transfer_timeout_ms: int | None = None

    @classmethod
    def of_engines(cls, prefill, decode, **extra) -> "BuildOverrides":
        """What a finished build compiled, from its prefill and decode engines' manifests (EngineManifest): TP, PP,
        batch and token budgets per role, the lengths, block size, KV and weights dtype (the prefill engine's; the
        rest of a plan comes from the recipes); `extra`: the other fields."""
        sizes: dict[str, object] = {}
        for role, manifest in (("prefill", prefill), ("decode", decode)):
            b = manifest.build_config
            sizes.update({f"{role}_tp": b.tp_size, f"{role}_pp": b.pp_size, f"{role}_max_batch_size": b.max_batch_size,
                          f"{role}_max_num_tokens": b.max_num_tokens})
        p = prefill.build_config
        return cls(**sizes, max_input_len=p.max_input_len, max_output_len=p.max_seq_len - p.max_input_len,
                   tokens_per_block=p.tokens_per_block, fp8=p.kv_dtype.value == "fp8",
                   weights_dtype=prefill.inputs.weights_dtype, **extra)


@dataclass(frozen=True)
class BuildRequest:
    model: ModelSpec
    model_source: str               # what quantize.py / convert_checkpoint.py get as --model_dir
    fp8: bool
    weights_dtype: str
    tokens_per_block: int
    max_input_len: int
    max_output_len: int
    calib_size: int
    build_flags: dict[str, str]
    transceiver_backend: str
    kv_transfer_timeout_ms: int
    decoupled: bool
    prefill: EngineRoleSpec
    decode: EngineRoleSpec
    engines_dir: Path
    examples_dir: str
    gpus_per_node: int
    warnings: tuple[str, ...] = field(default=())
    modelopt_dir: str | None = None     # Model-Optimizer checkout for serve-pytorch/checkpoint.sh (None: $MODELOPT_DIR)

    @property
    def kv_dtype(self) -> KvDtype:
        if self.fp8:
            return KvDtype.FP8
        return KvDtype.BF16 if self.weights_dtype == "bfloat16" else KvDtype.FP16

    @property
    def roles(self) -> tuple[EngineRoleSpec, EngineRoleSpec]:
        return (self.prefill, self.decode)

    @property
    def model_dir(self) -> Path:
        return self.engines_dir / self.model.name


def auto_tp(spec: ModelSpec, bytes_per_param: float, gpu_memory_gib: float) -> int:
    """Smallest power-of-two TP dividing the KV heads that keeps weights under half a GPU."""
    tp = 1
    while tp <= spec.num_kv_heads:
        if spec.num_kv_heads % tp == 0 and spec.weight_bytes(bytes_per_param) / tp <= gpu_memory_gib * GIB / 2:
            return tp
        tp *= 2
    raise ConfigError(f"{spec.name}: weights do not fit in half of {gpu_memory_gib:g} GiB GPUs at any TP up to "
                      f"{spec.num_kv_heads}; pass --prefill-tp/--decode-tp or a larger --gpu-memory-gib")


def _pick(override, recipe_value):
    return recipe_value if override is None else override


def _role_spec(role: str, recipe: RoleRecipe, o: BuildOverrides, spec: ModelSpec, fp8: bool,
               max_input_len: int, max_output_len: int, gpu_memory_gib: float, tokens_per_block: int) -> EngineRoleSpec:
    tp = _pick(getattr(o, f"{role}_tp"), recipe.tp_size)
    if tp == "auto":
        tp = auto_tp(spec, 1.0 if fp8 else 2.0, gpu_memory_gib)
    num_tokens = _pick(getattr(o, f"{role}_max_num_tokens"), recipe.max_num_tokens)
    chunked = recipe.enable_chunked_context
    if chunked == "auto":
        chunked = num_tokens < max_input_len
    batch = _pick(getattr(o, f"{role}_max_batch_size"), recipe.max_batch_size)
    if batch == "auto":
        batch = auto_prefill_batch_size(num_tokens, tokens_per_block)
    graphs = recipe.cuda_graph_cache_size
    if graphs == "auto":
        graphs = auto_cuda_graph_cache_size(batch) if recipe.cuda_graph_mode else 0
    max_seq_len = max_input_len + max_output_len
    kv_tokens = {"none": None, "batch": batch_kv_tokens(batch, max_seq_len, tokens_per_block)}.get(
        recipe.kv_cache_max_tokens, recipe.kv_cache_max_tokens)
    return EngineRoleSpec(
        role=role, tp_size=tp, pp_size=_pick(getattr(o, f"{role}_pp"), recipe.pp_size),
        max_batch_size=batch, max_num_tokens=num_tokens, max_input_len=max_input_len, max_seq_len=max_seq_len,
        max_beam_width=1, kv_cache_free_gpu_mem_fraction=recipe.kv_cache_free_gpu_mem_fraction,
        kv_cache_max_tokens=kv_tokens,
        enable_kv_cache_reuse=recipe.enable_kv_cache_reuse, batch_scheduler_policy=recipe.batch_scheduler_policy,
        enable_chunked_context=chunked, cuda_graph_mode=recipe.cuda_graph_mode,
        cuda_graph_cache_size=graphs, multi_block_mode=recipe.multi_block_mode,
        max_queue_delay_microseconds=recipe.max_queue_delay_microseconds, max_queue_size=recipe.max_queue_size,
        instances=_pick(getattr(o, f"{role}_instances"), recipe.instances))


def make_request(model: str, recipes: Recipes, overrides: BuildOverrides | None = None, *,
                 engines_dir: Path = Path("engines"), hf_model: str | None = None,
                 examples_dir: str = "/app/examples", gpus_per_node: int = 8,
                 gpu_memory_gib: float = 80.0, modelopt_dir: str | None = None) -> BuildRequest:
    """Resolves `model` (catalog name or HF folder) and validates every size; raises ConfigError."""
    o = overrides or BuildOverrides()
    for f in fields(o):
        value = getattr(o, f.name)
        if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
            raise ConfigError(f"--{f.name.replace('_', '-')} must be positive, got {value}")
    spec = resolve_model(model)
    c = recipes.common
    source = hf_model or (model if Path(model).is_dir() else (spec.hf_id or model))
    fp8 = _pick(o.fp8, c.fp8)
    max_input_len = _pick(o.max_input_len, c.max_input_len)
    max_output_len = _pick(o.max_output_len, c.max_output_len)
    tokens_per_block = _pick(o.tokens_per_block, c.tokens_per_block)
    roles = {r: _role_spec(r, recipes.role(r), o, spec, fp8, max_input_len, max_output_len, gpu_memory_gib,
                           tokens_per_block) for r in ("prefill", "decode")}
    request = BuildRequest(
        model=spec, model_source=str(source), fp8=fp8, weights_dtype=_pick(o.weights_dtype, c.weights_dtype),
        tokens_per_block=tokens_per_block, max_input_len=max_input_len,
        max_output_len=max_output_len, calib_size=c.calib_size, build_flags=dict(c.trtllm_build_flags),
        transceiver_backend=_pick(o.transceiver_backend, c.transceiver_backend).upper(),
        kv_transfer_timeout_ms=_pick(o.kv_transfer_timeout_ms, c.kv_transfer_timeout_ms), decoupled=c.decoupled,
        prefill=roles["prefill"], decode=roles["decode"], engines_dir=Path(engines_dir),
        examples_dir=examples_dir, gpus_per_node=gpus_per_node, modelopt_dir=modelopt_dir)
    return replace(request, warnings=tuple(validate(request)))


def validate(r: BuildRequest) -> list[str]:
    """Raises ConfigError for sizes that cannot work; returns warnings for ones that work badly."""
    m = r.model
    if r.weights_dtype not in ("float16", "bfloat16"):
        raise ConfigError(f"--dtype {r.weights_dtype}: use float16 or bfloat16")
    if r.transceiver_backend not in ("UCX", "NIXL"):
        raise ConfigError(f"--transport {r.transceiver_backend.lower()}: use ucx or nixl")
    if r.modelopt_dir is not None and not r.fp8:
        raise ConfigError(f"--modelopt-dir {r.modelopt_dir}: only FP8 weights need ModelOpt's hf_ptq.py (without "
                          f"FP8 serve-pytorch/ serves the Hugging Face checkpoint as it is); drop --modelopt-dir or "
                          f"pass --fp8")
    if r.tokens_per_block & (r.tokens_per_block - 1):
        raise ConfigError(f"--tokens-per-block {r.tokens_per_block} is not a power of two; "
                          f"TensorRT-LLM requires one (32 is its default)")
    total = r.max_input_len + r.max_output_len
    if total > m.max_position_embeddings:
        raise ConfigError(f"--max-input-len {r.max_input_len} + --max-output-len {r.max_output_len} = {total} exceeds "
                          f"{m.name}'s max_position_embeddings {m.max_position_embeddings}; lower one of them")
    warnings = []
    if not Path(r.model_source).is_dir():
        warnings.append(f"{r.model_source} is not a local folder: quantize.py/convert_checkpoint.py will fetch it "
                        f"from the Hugging Face Hub; pass --hf-model /path/to/checkpoint to build offline. The "
                        f"deploy folder's tokenizer/ is copied from the local Hugging Face cache that fetch fills "
                        f"(or --tokenizer-dir): the servers download nothing")
    for s in r.roles:
        flag = f"--{s.role}"
        if m.num_kv_heads % s.tp_size or m.num_heads % s.tp_size:
            ok = [str(t) for t in range(1, m.num_kv_heads + 1) if m.num_kv_heads % t == 0 and m.num_heads % t == 0]
            raise ConfigError(f"{flag}-tp {s.tp_size} does not divide {m.name}'s {m.num_kv_heads} KV heads "
                              f"({m.num_heads} attention heads); use one of {', '.join(ok)}")
        if m.num_layers % s.pp_size:
            raise ConfigError(f"{flag}-pp {s.pp_size} does not divide {m.name}'s {m.num_layers} layers")
        if s.max_num_tokens < r.tokens_per_block:
            raise ConfigError(f"{flag}-max-num-tokens {s.max_num_tokens} is below --tokens-per-block "
                              f"{r.tokens_per_block}; trtllm-build would raise it silently, so raise it yourself")
        if s.max_num_tokens > MAX_RECOMMENDED_NUM_TOKENS:
            warnings.append(f"{flag}-max-num-tokens {s.max_num_tokens} > {MAX_RECOMMENDED_NUM_TOKENS}: trtllm-build "
                            f"warns that this gives no speed-up and may exceed TensorRT's tensor volume")
        if s.max_batch_size > s.max_num_tokens:
            warnings.append(f"{flag}-max-batch-size {s.max_batch_size} > {flag}-max-num-tokens {s.max_num_tokens}: "
                            f"the runtime can never fill the batch")
    if r.prefill.max_num_tokens < r.max_input_len:
        raise ConfigError(f"--prefill-max-num-tokens {r.prefill.max_num_tokens} is below --max-input-len "
                          f"{r.max_input_len}; a prefill engine must take the longest prompt in one pass, so raise "
                          f"it to at least {r.max_input_len}")
    gpus = sum(s.gpus_per_instance * s.instances for s in r.roles)
    if gpus > r.gpus_per_node:
        raise ConfigError(f"this layout needs {gpus} GPUs (prefill {r.prefill.instances} x TP{r.prefill.tp_size}"
                          f"xPP{r.prefill.pp_size}, decode {r.decode.instances} x TP{r.decode.tp_size}"
                          f"xPP{r.decode.pp_size}) but --gpus-per-node is {r.gpus_per_node}; lower TP or "
                          f"instances, or raise --gpus-per-node")
    return warnings
