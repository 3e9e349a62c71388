"""P/D compatibility of two engines, from their manifests alone.

What must match (TensorRT-LLM's CacheFormatter::inquireSupport, trtllm-1.2.md §2.5): KV dtype,
tokens_per_block, layers, KV heads, head size; beam width 1 only. TP and PP may differ. The decode
engine must accept the whole prompt, because a generation-only request carries it.
"""

from __future__ import annotations

from pathlib import Path

from trtpd.schema.manifest import EngineManifest, load_manifest
from trtpd.lint.findings import Finding

_SHAPE_RULES = {
    "num_layers": "num-layers", "num_kv_heads": "num-kv-heads", "head_size": "head-size",
}


def lint_engine_pair(prefill: EngineManifest, decode: EngineManifest, *, max_prompt_tokens: int | None = None,
                     max_output_tokens: int | None = None) -> list[Finding]:
    """Findings for a prefill/decode pair. Lengths default to the prefill engine's max_input_len and
    the decode engine's max_seq_len - max_input_len."""
    p, d = prefill.build_config, decode.build_config
    prompt = max_prompt_tokens if max_prompt_tokens is not None else p.max_input_len
    output = max_output_tokens if max_output_tokens is not None else max(d.max_seq_len - d.max_input_len, 0)
    pair = f"prefill {prefill.folder_name} / decode {decode.folder_name}"
    findings = []
    if p.kv_dtype != d.kv_dtype:
        findings.append(Finding("kv-dtype", "error", pair,
                                f"KV dtype differs: prefill {p.kv_dtype.value}, decode {d.kv_dtype.value} "
                                f"(TensorRT-LLM refuses the transfer; older builds silently corrupt it)",
                                "rebuild both engines from checkpoints with the same kv_cache_quant_algo "
                                "(trtpd build --fp8 or --no-fp8 for both)"))
    if p.tokens_per_block != d.tokens_per_block:
        findings.append(Finding("tokens-per-block", "error", pair,
                                f"tokens_per_block differs: prefill {p.tokens_per_block}, decode {d.tokens_per_block}",
                                "rebuild both engines with the same --tokens-per-block (32 is the default)"))
    for field, rule in _SHAPE_RULES.items():
        mine, theirs = getattr(prefill.model, field), getattr(decode.model, field)
        if mine != theirs:
            findings.append(Finding(rule, "error", pair, f"{field} differs: prefill {mine}, decode {theirs}",
                                    "prefill and decode must be built from the same model"))
    if (prefill.kv_scales_digest and decode.kv_scales_digest
            and prefill.kv_scales_digest != decode.kv_scales_digest):
        findings.append(Finding("kv-scales", "error", pair, "FP8 KV scales differ (different calibrations)",
                                "build both engines from the same FP8-calibrated checkpoint run"))
    for role, cfg in (("prefill", p), ("decode", d)):
        if cfg.max_beam_width != 1:
            findings.append(Finding("beam-width", "error", f"{role} build_config.max_beam_width",
                                    f"max_beam_width is {cfg.max_beam_width}; disaggregated serving supports 1 only",
                                    "rebuild with --max_beam_width 1"))
    if p.max_input_len < prompt:
        findings.append(Finding("prefill-input-len", "error", "prefill build_config.max_input_len",
                                f"max_input_len {p.max_input_len} < longest prompt {prompt}",
                                f"rebuild the prefill engine with --max-input-len >= {prompt}"))
    if d.max_input_len < prompt or d.max_seq_len < prompt + output:
        findings.append(Finding("decode-input-len", "error", "decode build_config.max_input_len/max_seq_len",
                                f"decode takes prompts up to {d.max_input_len} and sequences up to {d.max_seq_len}, "
                                f"but requests reach a {prompt}-token prompt + {output} output tokens",
                                f"rebuild the decode engine with --max-input-len >= {prompt} and max_seq_len >= "
                                f"{prompt + output}"))
    findings += [f for m in (prefill, decode) for f in lint_multiple_profiles(m)]
    for role, m in (("prefill", prefill), ("decode", decode)):
        if m.status != "complete":
            severity = "error" if m.status == "failed" else "warning"
            findings.append(Finding("engine-status", severity, f"{role} manifest status",
                                    f"engine {m.folder_name} is {m.status!r}" + (f" ({m.error})" if m.error else ""),
                                    "run trtpd build on a machine with TensorRT-LLM 1.2.x and GPUs"))
    return findings


def lint_multiple_profiles(m: EngineManifest) -> list[Finding]:
    """FP8 with the GEMM plugin off: TensorRT picks GEMM tactics per profile, and upstream's perf guidance
    recommends --multiple_profiles enable "especially when GEMM plugin is disabled" (trtllm-1.2.md §6)."""
    build = next((s.argv for s in m.steps if s.name == "trtllm-build"), None)
    if build is None or m.inputs.quantization != "fp8":
        return []
    flags = {build[i]: build[i + 1] for i in range(len(build) - 1) if build[i].startswith("--")}
    gemm_off = flags.get("--gemm_plugin", "disable") == "disable"
    if not gemm_off or flags.get("--multiple_profiles") == "enable":
        return []
    return [Finding("multiple-profiles", "warning", f"{m.role} trtllm-build --multiple_profiles",
                    f"engine {m.folder_name} is FP8 with the GEMM plugin disabled but built without multiple "
                    f"optimization profiles, so one profile's GEMM tactics serve every batch shape",
                    "rebuild with --multiple_profiles enable (and no --opt_num_tokens, which it rejects)")]


def check_pair(prefill: Path, decode: Path) -> list[str]:
    """The errors of `lint_engine_pair` for two engine folders, as messages (render and fleet refuse on any)."""
    return [f"[{f.rule}] {f.message}; fix: {f.fix}" for f in
            lint_engine_pair(load_manifest(prefill), load_manifest(decode)) if f.severity == "error"]
