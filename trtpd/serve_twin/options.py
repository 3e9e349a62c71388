"""The twin's command line and LLM API options: trtllm-serve's, read the way the twin can use them. Pure.

Flags and YAML keys are TensorRT-LLM 1.2.1's (docs/serve-twin.md gives each one's source). Each one is
- used: it means the same on the twin (host, port, server_role, the cluster URI, the KV transfer timeout);
- checked: the reference engine folder fixes it, and a value that contradicts the folder is refused (a KV dtype
  other than the engine's, tokens_per_block) rather than silently run with another;
- ignored and named: it sizes GPUs (tensor parallelism, memory fractions, CUDA graphs), which the twin has not.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trtpd.errors import ConfigError

SERVER_ROLES = ("CONTEXT", "GENERATION")
KEY_FILE_ENV = "TRTPD_KV_KEY_FILE"   # the deployment key when the command line is trtllm-serve's (fleet/gpu_workers.py)
BACKENDS = ("pytorch", "tensorrt", "trt", "_autodeploy")
# cache_transceiver_config.backend -> the trtpd KV transport the twin moves KV over (trtpd/kv/endpoint.py):
# the twin has no NIXL or CUDA-aware UCX; a network transport for all but MPI, which trtpd's movers also have
KV_BACKENDS = {"DEFAULT": "tcp", "UCX": "tcp", "NIXL": "tcp", "MPI": "tcp"}
# cache_transceiver_config.kv_transfer_timeout_ms: unset at 1.2.1 means no timeout (llm_args.py
# CacheTransceiverConfig, default None; the 60000 default came after the release/1.2 cut): an export no generation
# server pulls is held until it is given up. The twin holds it for a day, the longest its exporter takes
NO_TIMEOUT_MS = 86_400_000
# flags that size GPUs or parallelism: accepted, named as ignored
_GPU_FLAGS = ("tp_size", "pp_size", "ep_size", "cluster_size", "gpus_per_node", "kv_cache_free_gpu_memory_fraction",
              "max_beam_width", "num_postprocess_workers", "trust_remote_code", "reasoning_parser",
              "fail_fast_on_attention_window_too_large", "enable_chunked_prefill", "max_batch_size",
              "max_num_tokens", "max_seq_len", "metadata_server_config_file", "media_io_kwargs")


@dataclass(frozen=True)
class TwinOptions:
    model: Path                       # a reference build (its root, or its checkpoint folder)
    host: str = "localhost"
    port: int = 8000
    backend: str = "pytorch"
    server_role: str | None = None    # CONTEXT | GENERATION | None (context and generation both)
    disagg_cluster_uri: str | None = None
    tokenizer: Path | None = None
    kv_transport: str = "tcp"
    kv_transfer_timeout_ms: int | None = None    # None: no timeout (1.2.1's default)
    kv_dtype: str | None = None       # kv_cache_config.dtype as asked (checked against the engine's)
    iter_perf_stats: bool = False     # enable_iter_perf_stats: /metrics returns iteration stats only with it
    perf_metrics_max_requests: int = 0   # /perf_metrics keeps this many records; 0 (or no return_perf_metrics): none
    tokens_per_block: int | None = None
    key_file: Path | None = None      # the twin's own: the deployment key (handles, KV pulls, the orchestrator)
    kv_host: str = "127.0.0.1"
    ignored: tuple[str, ...] = ()     # flags and keys accepted and not used, for the startup log
    served_model_name: str | None = None
    cluster: "DisaggClusterOptions | None" = None   # disagg_cluster (the YAML's, its cluster_uri overridden by the flag)
    state_file: Path | None = None
    step_delay_ms: int = 0

    @property
    def role(self) -> str:
        """The reference engine's role this worker runs."""
        return {"CONTEXT": "prefill", "GENERATION": "decode"}.get(self.server_role or "", "colocated")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trtpd.serve_twin",
        description="A CPU twin of a trtllm-serve worker (TensorRT-LLM 1.2.1's flags and YAML): the reference "
                    "engine behind /v1/completions with disaggregated_params, /health and /metrics.")
    p.add_argument("model", type=Path, help="a reference build: the folder `trtpd build --backend reference` "
                                            "wrote (reference-<kv dtype>), or its checkpoint/ folder")
    p.add_argument("--tokenizer", type=Path, default=None, help="the tokenizer folder (default: the checkpoint's)")
    p.add_argument("--host", default="localhost", help="the address to bind (trtllm-serve's default: localhost)")
    p.add_argument("--port", type=int, default=8000, help="the HTTP port (trtllm-serve's default: 8000)")
    p.add_argument("--backend", default="pytorch", choices=BACKENDS,
                   help="accepted as trtllm-serve's; the twin always runs the reference engine")
    p.add_argument("--log_level", default="info", choices=("trace", "debug", "info", "warning", "error",
                                                            "critical", "verbose", "internal_error"))
    p.add_argument("--server_role", default=None, type=str.upper, choices=SERVER_ROLES,
                   help="CONTEXT (prefill) or GENERATION (decode); none: both phases on this worker")
    p.add_argument("--disagg_cluster_uri", default=None,
                   help="http://host:port of the cluster this worker registers with (the router's, or trtpd's "
                        "gateway's)")
    p.add_argument("--extra_llm_api_options", "--config", dest="extra_llm_api_options", type=Path, default=None,
                   help="the LLM API options YAML (cache_transceiver_config, kv_cache_config, ...)")
    p.add_argument("--served_model_name", default=None, help=argparse.SUPPRESS)
    for flag in _GPU_FLAGS:
        p.add_argument(f"--{flag}", default=None, help=argparse.SUPPRESS)
    twin = p.add_argument_group("twin only (not trtllm-serve's)")
    twin.add_argument("--twin_key_file", type=Path, default=None,
                      help=f"the deployment key file: signs KV handles, proves KV pulls and the orchestrator's "
                           f"requests (required with --server_role; default: ${KEY_FILE_ENV}, which a fleet sets "
                           f"when it starts the twin with trtllm-serve's own command line)")
    twin.add_argument("--twin_kv_host", default="127.0.0.1", help="the address the KV exporter binds (prefill)")
    twin.add_argument("--twin_step_delay_ms", type=int, default=0,
                      help="fault injection: a pause after every engine step (a deployment spec's step_delay_ms)")
    twin.add_argument("--twin_state_file", type=Path, default=None,
                      help="write {pid, start_time, host, port} here (JSON) once listening (with --port 0)")
    return p


def parse_args(argv: list[str], env: Mapping[str, str] | None = None) -> TwinOptions:
    """env: where $TRTPD_KV_KEY_FILE is read (default: os.environ)."""
    args = parser().parse_args(argv)
    env = os.environ if env is None else env
    if args.twin_key_file is None and env.get(KEY_FILE_ENV):
        args.twin_key_file = Path(env[KEY_FILE_ENV])
    ignored = [f"--{f}" for f in _GPU_FLAGS if getattr(args, f) is not None]
    if args.backend != "pytorch":
        ignored.append(f"--backend {args.backend}")
    llm = read_llm_api_options(args.extra_llm_api_options) if args.extra_llm_api_options else LlmApiOptions()
    cluster = llm.cluster
    if args.disagg_cluster_uri:
        cluster = DisaggClusterOptions(args.disagg_cluster_uri) if cluster is None else \
            dataclasses.replace(cluster, cluster_uri=args.disagg_cluster_uri)
    if cluster is not None and not cluster.cluster_uri:
        raise ConfigError("disagg_cluster has no cluster_uri: give it in the YAML or with --disagg_cluster_uri")
    if cluster is not None and not args.server_role:
        raise ConfigError("--server_role is required with a disagg cluster (--disagg_cluster_uri or the YAML's "
                          "disagg_cluster): it says whether this worker registers as CONTEXT or GENERATION")
    if args.server_role and args.twin_key_file is None:
        raise ConfigError(f"--server_role {args.server_role} needs --twin_key_file (or ${KEY_FILE_ENV}): the "
                          f"deployment key signs the KV handles and the orchestrator's requests")
    return TwinOptions(model=args.model, host=args.host, port=args.port, backend=args.backend,
                       server_role=args.server_role, disagg_cluster_uri=args.disagg_cluster_uri,
                       tokenizer=args.tokenizer, kv_transport=llm.kv_transport,
                       kv_transfer_timeout_ms=llm.kv_transfer_timeout_ms, kv_dtype=llm.kv_dtype,
                       iter_perf_stats=llm.iter_perf_stats,
                       perf_metrics_max_requests=llm.perf_metrics_max_requests if llm.return_perf_metrics else 0,
                       tokens_per_block=llm.tokens_per_block, key_file=args.twin_key_file,
                       kv_host=args.twin_kv_host, ignored=tuple(ignored + list(llm.ignored)),
                       served_model_name=args.served_model_name, cluster=cluster, state_file=args.twin_state_file,
                       step_delay_ms=max(0, args.twin_step_delay_ms))


@dataclass(frozen=True)
class DisaggClusterOptions:
    """disagg_cluster (tensorrt_llm/llmapi/disagg_utils.py DisaggClusterConfig; its defaults)."""

    cluster_uri: str
    cluster_name: str = ""
    heartbeat_interval_sec: float = 5
    inactive_timeout_sec: float = 10

    @classmethod
    def from_dict(cls, data: object, source: str) -> "DisaggClusterOptions":
        if not isinstance(data, dict) or not isinstance(data.get("cluster_uri", ""), str):
            raise ConfigError(f"{source}: disagg_cluster must be a mapping (cluster_uri a string; --disagg_cluster_uri "
                              f"may give it instead)")
        known = ("cluster_uri", "cluster_name", "minimal_instances", "heartbeat_interval_sec", "inactive_timeout_sec")
        unknown = [k for k in data if k not in known]
        if unknown:    # DisaggClusterConfig(**section) raises on them upstream
            raise ConfigError(f"{source}: disagg_cluster.{unknown[0]} is not a DisaggClusterConfig field "
                              f"({', '.join(known)})")
        return cls(data.get("cluster_uri", ""), str(data.get("cluster_name") or ""),
                   float(data.get("heartbeat_interval_sec", 5)), float(data.get("inactive_timeout_sec", 10)))


@dataclass(frozen=True)
class LlmApiOptions:
    kv_transport: str = "tcp"
    kv_transfer_timeout_ms: int | None = None
    kv_dtype: str | None = None
    tokens_per_block: int | None = None
    iter_perf_stats: bool = False
    return_perf_metrics: bool = False
    perf_metrics_max_requests: int = 0
    ignored: tuple[str, ...] = field(default_factory=tuple)
    cluster: DisaggClusterOptions | None = None


def llm_api_options(data: dict, source: str = "extra_llm_api_options") -> LlmApiOptions:
    """The keys the twin uses from an LLM API options mapping; every other key is named in `ignored`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of LLM API options, got {type(data).__name__}")
    ignored: list[str] = []
    transceiver = _section(data, "cache_transceiver_config", source)
    kv_cache = _section(data, "kv_cache_config", source)
    backend = str(transceiver.get("backend") or "DEFAULT").upper()
    if backend not in KV_BACKENDS:
        raise ConfigError(f"{source}: cache_transceiver_config.backend {transceiver.get('backend')!r} is not one of "
                          f"{', '.join(KV_BACKENDS)}")
    timeout = transceiver.get("kv_transfer_timeout_ms")
    if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0):
        raise ConfigError(f"{source}: cache_transceiver_config.kv_transfer_timeout_ms must be a positive integer "
                          f"(milliseconds), got {timeout!r}")
    tokens_per_block = kv_cache.get("tokens_per_block")
    if tokens_per_block is not None and (not isinstance(tokens_per_block, int) or tokens_per_block <= 0):
        raise ConfigError(f"{source}: kv_cache_config.tokens_per_block must be a positive integer, "
                          f"got {tokens_per_block!r}")
    dtype = kv_cache.get("dtype")
    ignored += [f"cache_transceiver_config.{k}" for k in transceiver if k not in ("backend", "kv_transfer_timeout_ms")]
    ignored += [f"kv_cache_config.{k}" for k in kv_cache if k not in ("dtype", "tokens_per_block")]
    flags = {}
    for key in ("enable_iter_perf_stats", "return_perf_metrics"):
        flags[key] = data.get(key, False)
        if not isinstance(flags[key], bool):
            raise ConfigError(f"{source}: {key} must be true or false, got {flags[key]!r}")
    # llm_args.py: perf_metrics_max_requests is a NonNegativeInt (the /perf_metrics deque's maxlen)
    max_records = data.get("perf_metrics_max_requests", 0)
    if not isinstance(max_records, int) or isinstance(max_records, bool) or max_records < 0:
        raise ConfigError(f"{source}: perf_metrics_max_requests must be a non-negative integer, got {max_records!r}")
    # serve.py pops a top-level disagg_cluster before the rest become LLM args
    cluster = DisaggClusterOptions.from_dict(data["disagg_cluster"], source) if "disagg_cluster" in data else None
    used = ("cache_transceiver_config", "kv_cache_config", "enable_iter_perf_stats", "disagg_cluster",
            "return_perf_metrics", "perf_metrics_max_requests")
    ignored += [k for k in data if k not in used]
    return LlmApiOptions(KV_BACKENDS[backend], timeout, None if dtype in (None, "auto") else str(dtype),
                         tokens_per_block, flags["enable_iter_perf_stats"], flags["return_perf_metrics"], max_records,
                         tuple(ignored), cluster)


def read_llm_api_options(path: Path) -> LlmApiOptions:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--extra_llm_api_options {path}: cannot read it ({exc})") from None
    return llm_api_options(data, str(path))


def _section(data: dict, key: str, source: str) -> dict:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {key} must be a mapping, got {type(value).__name__}")
    return value
