"""P/D compatibility of two engines, from their manifests alone.

What must match (TensorRT-LLM's CacheFormatter::inquireSupport, trtllm-1.2.md §2.5): KV dtype,
tokens_per_block, layers, KV heads, head size; beam width 1 only. TP and PP may differ. The decode
engine must accept the whole prompt, because a generation-only request carries it. With FP8 KV the
per-layer scaling factors must match too; inquireSupport compares the two CacheStates (dtype, KV heads,
head size, tokens_per_block, layers, attention type, kv factor: cpp/tensorrt_llm/batch_manager/
cacheFormatter.cpp, the version trtllm-1.2.md §2.5 cites), which carry no scaling factors, so only the
manifests' `kv_scales_digest` shows a mismatch.
"""

from __future__ import annotations

from pathlib import Path

from trtpd.catalog import KvDtype
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
    findings += lint_kv_scales(prefill, decode)
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


def lint_kv_scales(prefill: EngineManifest, decode: EngineManifest) -> list[Finding]:
    """FP8 KV is written with prefill's per-layer scales and read with decode's, so the two must be equal. Each
    manifest's `kv_scales_digest` is read back from its checkpoint when it is built (trtllm/kv_scales.py); two
    engines of one checkpoint share one calibration, two checkpoints (different TP) had two."""
    p, d = prefill.kv_scales_digest, decode.kv_scales_digest
    pair = f"prefill {prefill.folder_name} / decode {decode.folder_name}"
    if p and d and p != d:
        return [Finding("kv-scales", "error", "kv_scales_digest",
                        f"kv_scales_digest differs: prefill {prefill.folder_name} has {p}, decode {decode.folder_name} "
                        f"has {d}: their FP8 KV scaling factors come from calibrations that disagree, so decode "
                        f"would read prefill's KV with the wrong scale",
                        "rebuild both engines at the same TP (one checkpoint, one calibration) or rebuild with "
                        "--force until both calibrations agree (trtpd build compares them and refuses otherwise)")]
    two_checkpoints = prefill.inputs.checkpoint_dir != decode.inputs.checkpoint_dir
    built = prefill.status == decode.status == "complete"
    fp8 = prefill.build_config.kv_dtype is KvDtype.FP8 and decode.build_config.kv_dtype is KvDtype.FP8
    if fp8 and built and two_checkpoints and not (p and d):
        lacking = " and ".join(r for r, digest in (("prefill", p), ("decode", d)) if not digest)
        return [Finding("kv-scales-unverified", "error", f"{pair} kv_scales_digest",
                        f"FP8 engines from two checkpoints ({prefill.inputs.checkpoint_dir}, "
                        f"{decode.inputs.checkpoint_dir}), two calibrations, and the {lacking} manifest has no "
                        f"kv_scales_digest: nothing shows that prefill writes KV with the scales decode reads it with",
                        "rebuild both engines with this trtpd (trtpd build --force reads the scales back from the "
                        "checkpoints, compares them and records kv_scales_digest), or build both roles at the same TP")]
    return []


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
