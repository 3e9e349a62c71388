"""The trtllm-serve path: per-role LLM API options and the disaggregated router config."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

from trtpd.errors import ConfigError
from trtpd.lint.findings import Finding

ROUTER_SECTIONS = ("context_servers", "generation_servers")


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
    buffer = ctc.get("max_tokens_in_buffer")
    if buffer is None:
        findings.append(Finding("transfer-buffer", "warning", f"{source}: cache_transceiver_config.max_tokens_in_buffer",
                                "unset; TensorRT-LLM recommends at least the longest prompt",
                                f"set max_tokens_in_buffer: {max_prompt_tokens}"))
    elif int(buffer) < max_prompt_tokens:
        findings.append(Finding("transfer-buffer", "error", f"{source}: cache_transceiver_config.max_tokens_in_buffer",
                                f"{buffer} tokens is less than the longest prompt ({max_prompt_tokens})",
                                f"set max_tokens_in_buffer: {max_prompt_tokens} or more"))
    timeout = ctc.get("kv_transfer_timeout_ms")
    if timeout is None or int(timeout) <= 0:
        findings.append(Finding("transfer-timeout", "error", f"{source}: cache_transceiver_config.kv_transfer_timeout_ms",
                                f"{'unset' if timeout is None else timeout}: a lost peer leaves the request (and its "
                                f"KV blocks) stuck forever", "set a finite kv_transfer_timeout_ms, e.g. 60000"))
    if role == "prefill" and _section(options, "kv_cache_config").get("enable_block_reuse", True) is not False:
        findings.append(Finding("context-kv-reuse", "error", f"{source}: kv_cache_config.enable_block_reuse",
                                "KV reuse is on (the default) on the context side; a block can be evicted before it "
                                "is sent and the decode side waits forever (NVIDIA/TensorRT-LLM#12542)",
                                "set kv_cache_config.enable_block_reuse: false"))
    return findings


def lint_router(router: Mapping, *, source: str) -> list[Finding]:
    findings = []
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
                       max_prompt_tokens: int, sources: Mapping[str, str] | None = None) -> list[Finding]:
    names = {"prefill": "prefill.yaml", "decode": "decode.yaml", "router": "disagg.yaml", **(sources or {})}
    findings = lint_role_options("prefill", prefill_options, max_prompt_tokens=max_prompt_tokens,
                                 source=names["prefill"])
    findings += lint_role_options("decode", decode_options, max_prompt_tokens=max_prompt_tokens,
                                  source=names["decode"])
    if router is not None:
        findings += lint_router(router, source=names["router"])
    return findings


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
