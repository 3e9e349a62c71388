"""Typed lint findings and the rule catalogue: each rule says what is wrong and what to change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]     # info: a limit of the stack to know, not a fault

# rule id -> what it checks. Every rule has a firing and a quiet test in tests/unit/lint/.
RULES: dict[str, str] = {
    "kv-dtype": "prefill and decode KV dtypes are equal (engines, or PyTorch servers' kv_cache_config.dtype)",
    "tokens-per-block": "prefill and decode tokens_per_block are equal (engines, or kv_cache_config)",
    "num-layers": "prefill and decode have the same number of layers",
    "num-kv-heads": "prefill and decode have the same number of KV heads",
    "head-size": "prefill and decode have the same head size",
    "kv-scales": "FP8 KV scales (kv_scales_digest) are equal on both sides",
    "kv-scales-unverified": "FP8 engines from two checkpoints (two calibrations) both record kv_scales_digest",
    "beam-width": "both engines are built with max_beam_width 1",
    "prefill-input-len": "the prefill engine accepts the longest prompt",
    "decode-input-len": "the decode engine accepts the longest prompt and prompt + output",
    "engine-status": "both engines finished building",
    "transceiver-backend": "trtllm-serve cache_transceiver_config.backend is set, to one of 1.2.1's DEFAULT, UCX, "
                           "NIXL, MPI",
    "transfer-buffer": "cache_transceiver_config.max_tokens_in_buffer holds the longest prompt",
    "transfer-timeout": "cache_transceiver_config.kv_transfer_timeout_ms is set and finite",
    "transfer-timeout-scope": "kv_transfer_timeout_ms is enforced only by trtllm-serve's PyTorch backend in 1.2.1",
    "context-kv-reuse": "KV reuse is off on the context (prefill) side",
    "router-instances": "router num_instances equals the number of urls (a router with disagg_cluster has none)",
    "disagg-cluster": "servers and router share one disagg_cluster (name, URI, the router's own address) and "
                      "heartbeat before their registration expires",
    "context-overlap-scheduler": "PyTorch-backend context servers set disable_overlap_scheduler: true",
    "iter-perf-stats": "PyTorch-backend servers set enable_iter_perf_stats: true (/metrics is empty without it)",
    "mpi-world": "MPI world size = context TP*PP + generation TP*PP + 1, ranks 1..N-1 all used",
    "participant-ids": "participant_ids are disjoint between models and sized TP*PP per instance",
    "placeholders": "no ${...} placeholder is left unfilled",
    "model-name-folder": "every config.pbtxt name equals its folder",
    "model-config": "every config.pbtxt parses as Triton's ModelConfig",
    "ports": "ports are distinct and free",
    "backend-parameters": "every parameter the 1.2.1 tensorrtllm backend reads with no fallback is present",
    "decode-num-tokens": "decode max_num_tokens holds the longest prompt, or chunked context is on",
    "multiple-profiles": "FP8 engines built with the GEMM plugin disabled use --multiple_profiles enable",
    "ucx-env": "the trtllm-serve launch sets the UCX variables upstream recommends",
    "tokenizer": "every server reads a local tokenizer folder with tokenizer.json, never a hub id (no download)",
    "mpi-transfer-limits": "the Triton MPI path has no KV-transfer timeout or transport setting; its buffer is an "
                           "environment variable (what to do instead)",
}


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    subject: str          # the file, field or flag at fault
    message: str          # what is wrong
    fix: str              # what to change

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown lint rule {self.rule!r}")

    def format(self) -> str:
        return f"{self.severity}: [{self.rule}] {self.subject}: {self.message}; fix: {self.fix}"


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


def summary(findings: list[Finding]) -> str:
    n_err = len(errors(findings))
    n_info = sum(1 for f in findings if f.severity == "info")
    text = f"lint: {n_err} error(s), {len(findings) - n_err - n_info} warning(s)"
    return text + (f", {n_info} note(s)" if n_info else "")
