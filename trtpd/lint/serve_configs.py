"""The trtllm-serve paths (engines, and the PyTorch backend): per-role LLM API options and the router config."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from trtpd.errors import ConfigError
from trtpd.lint.disagg_cluster import lint_router_cluster, lint_worker_cluster
from trtpd.lint.findings import Finding

ROUTER_SECTIONS = ("context_servers", "generation_servers")
# CacheTransceiverConfig.backend at 1.2.1: Optional[Literal["DEFAULT", "UCX", "NIXL", "MPI"]] (llm_args.py, id
# 1090804222; lower-case before mid-2025, MOONCAKE after the cut); anything else fails the server's start
TRANSCEIVER_BACKENDS = ("DEFAULT", "UCX", "NIXL", "MPI")


def _section(options: Mapping, key: str) -> Mapping:
    value = options.get(key)
    return value if isinstance(value, Mapping) else {}


def lint_role_options(role: str, options: Mapping, *, max_prompt_tokens: int, source: str) -> list[Finding]:
    findings = []
    ctc = _section(options, "cache_transceiver_config")
    if not ctc.get("backend"):
        findings.append(Finding("transceiver-backend", "error", f"{source}: cache_transceiver_config.backend",
                                "unset, so the KV transceiver is disabled and context-only requests fail with "
                                "'Disaggregated serving is not enabled'", "set backend: UCX (or NIXL)"))
    elif ctc["backend"] not in TRANSCEIVER_BACKENDS:
        upper = str(ctc["backend"]).upper()
        findings.append(Finding("transceiver-backend", "error", f"{source}: cache_transceiver_config.backend",
                                f"{ctc['backend']!r} is not one of TensorRT-LLM 1.2.1's "
                                f"{', '.join(TRANSCEIVER_BACKENDS)} (upper case): the server refuses the YAML at start",
                                f"set backend: {upper if upper in TRANSCEIVER_BACKENDS else 'UCX'}"))
    buffer = ctc.get("max_tokens_in_buffer")
    if buffer is None:
        findings.append(Finding("transfer-buffer", "warning", f"{source}: cache_transceiver_config.max_tokens_in_buffer",
                                "unset; it must exceed the longest prompt (Dynamo's TensorRT-LLM known issues: "
                                "KV cache exhaustion deadlocks workers under sustained load)",
                                f"set max_tokens_in_buffer above {max_prompt_tokens}, e.g. {max_prompt_tokens + 32}"))
    elif int(buffer) <= max_prompt_tokens:
        findings.append(Finding("transfer-buffer", "error", f"{source}: cache_transceiver_config.max_tokens_in_buffer",
                                f"{buffer} tokens is {'equal to' if int(buffer) == max_prompt_tokens else 'less than'} "
                                f"the longest prompt ({max_prompt_tokens}); Dynamo's TensorRT-LLM known issues: below "
                                f"or at the maximum ISL, transfers time out under sustained load and workers deadlock",
                                f"set max_tokens_in_buffer above {max_prompt_tokens}, e.g. {max_prompt_tokens + 32} "
                                f"(one KV block more)"))
    timeout = ctc.get("kv_transfer_timeout_ms")
    if timeout is None or int(timeout) <= 0:
        findings.append(Finding("transfer-timeout", "error", f"{source}: cache_transceiver_config.kv_transfer_timeout_ms",
                                f"{'unset' if timeout is None else timeout}: where it is enforced (the PyTorch "
                                f"backend's executor; see transfer-timeout-scope) a lost peer then leaves the request "
                                f"(and its KV blocks) stuck forever", "set a finite kv_transfer_timeout_ms, e.g. 60000"))
    if role == "prefill" and _section(options, "kv_cache_config").get("enable_block_reuse", True) is not False:
        findings.append(Finding("context-kv-reuse", "error", f"{source}: kv_cache_config.enable_block_reuse",
                                "KV reuse is on (the default) on the context side; a block can be evicted before it "
                                "is sent and the decode side waits forever (NVIDIA/TensorRT-LLM#12542)",
                                "set kv_cache_config.enable_block_reuse: false"))
    return findings


def lint_pytorch_role_options(role: str, options: Mapping, *, source: str) -> list[Finding]:
    """Keys only a PyTorch-backend server reads (TorchLlmArgs)."""
    findings = []
    if role == "prefill" and options.get("disable_overlap_scheduler") is not True:
        findings.append(Finding(
            "context-overlap-scheduler", "error", f"{source}: disable_overlap_scheduler",
            f"{'unset (false)' if 'disable_overlap_scheduler' not in options else options['disable_overlap_scheduler']}"
            f" on a context server: the overlap scheduler 'is not yet supported in disaggregated context server "
            f"architectures' (NVIDIA/TensorRT-LLM examples/disaggregated/README.md)",
            "set disable_overlap_scheduler: true in the context servers' YAML"))
    if options.get("enable_iter_perf_stats") is not True:
        findings.append(Finding(
            "iter-perf-stats", "warning", f"{source}: enable_iter_perf_stats",
            "not true, so the server's /metrics answers [] and trtpd's gateway sees no queue or KV usage from it",
            "set enable_iter_perf_stats: true"))
    return findings


def lint_role_pair(prefill: Mapping, decode: Mapping, *, sources: Mapping[str, str]) -> list[Finding]:
    """What CacheFormatter::inquireSupport compares between the two sides, where the YAML sets it (the PyTorch
    backend; an engine's come from the engine and are linted by engine_pair.py): KV dtype and tokens_per_block."""
    findings = []
    p, d = _section(prefill, "kv_cache_config"), _section(decode, "kv_cache_config")
    subject = f"{sources['prefill']} vs {sources['decode']}: kv_cache_config"
    dtypes = (p.get("dtype", "auto"), d.get("dtype", "auto"))
    if dtypes[0] != dtypes[1]:
        depends = "auto" in dtypes
        findings.append(Finding(
            "kv-dtype", "warning" if depends else "error", f"{subject}.dtype",
            f"prefill {dtypes[0]}, decode {dtypes[1]}" + (
                ": 'auto' takes the checkpoint's kv_cache_quant_algo, so the two agree only if the checkpoint says "
                f"{dtypes[0] if dtypes[1] == 'auto' else dtypes[1]}" if depends else
                ": the transceiver refuses the transfer (CacheFormatter::inquireSupport compares the data types)"),
            "give both roles the same kv_cache_config.dtype"))
    blocks = (p.get("tokens_per_block", 32), d.get("tokens_per_block", 32))
    if blocks[0] != blocks[1]:
        findings.append(Finding("tokens-per-block", "error", f"{subject}.tokens_per_block",
                                f"prefill {blocks[0]}, decode {blocks[1]}: the transceiver refuses the transfer",
                                "give both roles the same tokens_per_block"))
    return findings


def lint_decode_num_tokens(options: Mapping, *, max_num_tokens: int, max_prompt_tokens: int,
                           source: str) -> list[Finding]:
    """Without chunked prefill the runtime caps input at max_num_tokens (trtGptModel.h) and rejects longer
    prompts, generation-only requests included (LlmRequest::validate; trtllm-1.2.md §6)."""
    if max_num_tokens >= max_prompt_tokens or options.get("enable_chunked_prefill") is True:
        return []
    return [Finding("decode-num-tokens", "error", f"{source}: enable_chunked_prefill",
                    f"decode max_num_tokens is {max_num_tokens} but prompts reach {max_prompt_tokens} tokens and "
                    f"chunked prefill is {'unset' if 'enable_chunked_prefill' not in options else 'off'}, so every "
                    f"longer generation-only request is rejected",
                    f"set enable_chunked_prefill: true, or rebuild decode with max_num_tokens >= {max_prompt_tokens}")]


def lint_serve_launch(script: str, *, source: str) -> list[Finding]:
    """The UCX variables upstream recommends for the KV transceiver (sources: trtpd/trtllm/serve_config.py UCX_ENV),
    and what kv_transfer_timeout_ms does not do for servers of compiled engines."""
    wanted = {"UCX_MEMTYPE_CACHE": "n (TensorRT-LLM disaggregated-service doc, #2518)",
              "UCX_CUDA_IPC_ENABLE_MNNVL": "n, or y on a multi-node NVLink domain (kv_cache_transceiver.py's UCX advice)"}
    findings = [Finding("ucx-env", "warning", f"{source}: {name}",
                        f"the launch does not set {name}; without it UCX transfers can hang or fail across NVLink domains",
                        f"export {name}={value} before starting the servers")
                for name, value in wanted.items() if not re.search(rf"(^|\s)(export\s+)?{name}=", script, re.M)]
    if re.search(r"trtllm-serve\s.*--backend[\s=]+tensorrt\b", script):
        findings.append(timeout_scope_note(source))
    findings += [tokenizer_finding(f"{source}: --tokenizer {value}", value)
                 for value in dict.fromkeys(re.findall(r"--tokenizer[\s=]+(\S+)", script)) if not value.startswith("/")]
    return findings


def tokenizer_finding(subject: str, value: str, missing: bool = False) -> Finding:
    """A server told to load its tokenizer from a hub id downloads it at start (a gated model needs an HF_TOKEN the
    containers do not get); trtpd build puts a copy in the deploy folder (trtllm/tokenizer_files.py)."""
    problem = (f"{value}/tokenizer.json does not exist" if missing else
               f"{value!r} is not an absolute local path: a hub id makes the server download the tokenizer at start, "
               f"which needs the network and, for a gated model, an HF_TOKEN the containers do not get")
    return Finding("tokenizer", "error", subject, problem,
                   "point it at the deploy folder's tokenizer/ (trtpd build fills it from --tokenizer-dir, the model "
                   "folder or the local Hugging Face cache)")


def timeout_scope_note(source: str) -> Finding:
    """In 1.2.1 only the PyTorch executor enforces kv_transfer_timeout_ms: tensorrt_llm/_torch/pyexecutor/
    py_executor.py _check_kv_transfer_timeout (added by NVIDIA/TensorRT-LLM PR #6801). The C++ CacheTransceiver
    that --backend tensorrt runs (cpp/tensorrt_llm/batch_manager/cacheTransceiver.cpp of the 1.2 line) never reads
    it: checkContextTransferStatus/checkGenTransferStatus wait on the transfer futures with no deadline. Deadline
    code reached the C++ transceiver after 1.2.1 (PR #12476 closed unmerged; PR #14768, 2026-05-30, observe-only)."""
    return Finding(
        "transfer-timeout-scope", "info", f"{source}: --backend tensorrt",
        "kv_transfer_timeout_ms is enforced by the PyTorch backend's executor only (py_executor.py "
        "_check_kv_transfer_timeout); TensorRT-LLM 1.2.1's C++ cache transceiver, which serves compiled engines, "
        "does not read it, so a transfer to a lost peer holds its request and KV blocks until the server restarts",
        "give clients a deadline, watch the servers' in-flight requests and KV usage, and restart a server whose "
        "transfers stop; do not size drains or preStop hooks from kv_transfer_timeout_ms for these servers")


def lint_router(router: Mapping, *, source: str) -> list[Finding]:
    """Static urls; a router with disagg_cluster ignores them (disagg_cluster.lint_router_cluster checks it)."""
    findings = []
    if "disagg_cluster" in router:
        return lint_router_cluster(router, source=source)
    for section in ROUTER_SECTIONS:
        servers = _section(router, section)
        urls = servers.get("urls") or []
        num = servers.get("num_instances", 1)
        if not urls or num != len(urls):
            findings.append(Finding("router-instances", "error", f"{source}: {section}",
                                    f"num_instances is {num} but {len(urls)} url(s) are listed "
                                    f"(trtllm-serve disaggregated raises ValueError)",
                                    f"list one url per instance and set num_instances: {len(urls) or 1}"))
    return findings


def router_ports(router: Mapping) -> dict[str, int]:
    ports = {"router": int(router.get("port", 8000))}
    for section in ROUTER_SECTIONS:
        for i, url in enumerate(_section(router, section).get("urls") or []):
            ports[f"{section}[{i}] {url}"] = int(str(url).rsplit(":", 1)[-1])
    return ports


def lint_serve_configs(prefill_options: Mapping, decode_options: Mapping, router: Mapping | None, *,
                       max_prompt_tokens: int, sources: Mapping[str, str] | None = None,
                       decode_max_num_tokens: int | None = None, backend: str = "tensorrt") -> list[Finding]:
    """`backend`: the servers' --backend (serve_backend of their launch script); "pytorch" adds its keys' rules."""
    names = {"prefill": "prefill.yaml", "decode": "decode.yaml", "router": "disagg.yaml", **(sources or {})}
    roles = {"prefill": prefill_options, "decode": decode_options}
    findings = []
    for role, options in roles.items():
        findings += lint_role_options(role, options, max_prompt_tokens=max_prompt_tokens, source=names[role])
        if backend == "pytorch":
            findings += lint_pytorch_role_options(role, options, source=names[role])
    findings += lint_role_pair(prefill_options, decode_options, sources=names)
    if decode_max_num_tokens is not None:
        findings += lint_decode_num_tokens(decode_options, max_num_tokens=decode_max_num_tokens,
                                           max_prompt_tokens=max_prompt_tokens, source=names["decode"])
    if router is not None:
        findings += lint_router(router, source=names["router"])
        for role, options in roles.items():
            findings += lint_worker_cluster(options, router, source=names[role])
    return findings


def serve_backend(launch_script: str) -> str | None:
    """The --backend of a launch script's trtllm-serve servers ("tensorrt" if any runs engines, else "pytorch",
    trtllm-serve's default), or None when it starts none."""
    workers = re.findall(r"trtllm-serve\s+(?!disaggregated\b)\S+(.*)", launch_script)
    if not workers:
        return None
    backends = {(re.search(r"--backend[\s=]+(\w+)", rest) or [None, "pytorch"])[1] for rest in workers}
    return "tensorrt" if backends & {"tensorrt", "trt"} else "pytorch"


def load_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping")
    return data
