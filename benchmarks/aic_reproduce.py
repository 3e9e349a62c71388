"""AIConfigurator's own answer for its documented estimate example, reproduced by trtpd from the same database.

The scenario is the `cli estimate` example of AIConfigurator's CLI user guide (docs/cli_user_guide.md,
"Estimate mode"): Qwen/Qwen3-32B on h200_sxm, TP2, batch 64, ISL 2048, OSL 512, TensorRT-LLM, SILICON
database (AIC resolves bf16 GEMMs, bf16 KV cache and bf16 FMHA for this checkpoint). AIC 0.12.0 runs in its
own environment (.venv-aic: it needs numpy >= 2.1, trtpd's .venv pins numpy < 2), through its Python API
(cli_estimate) and once through its command line (`aiconfigurator cli estimate ...`, whose printed figures
must equal the API's). trtpd reads the same installed parquet tables, exported to CSV by
trtpd/perf/aic_export.py run in .venv-aic (trtpd's .venv has no pyarrow).

Two of AIC's estimate modes, each against trtpd's closest static estimate:
* static (`--estimate-mode static`): one context pass of 64 prompts x 2,048 tokens (TTFT), then 511 decode
  steps of 64 sequences (TPOT = their mean; AIC samples every 32nd step, trtpd takes every step);
  tokens/s/GPU = 64 x 512 / request latency / 2. trtpd: AicComposer, the sum of the same measured operators.
* agg (the default, in-flight batching): trtpd.planner.colocated.static_point (TensorRT-LLM in-flight
  batching, no queueing) on the hardware profile `trtpd profile --from aiconfigurator` would write, at the
  rate that keeps 64 sequences in flight, and the same computed here step by step with whole prompts.
  TPOT and tokens/s/GPU are compared, both ways. AIC's agg TTFT is its prefill
  step (one 2,048-token prompt next to 63 decode rows) times a queueing factor for a batch whose requests
  all arrive at once (base_backend._ttft_queuing_factor: min(2 + (ceil(ISL x batch / ctx_tokens) - 3) / 20,
  4) = 4.0 here); trtpd's static estimate has no queueing (its simulator models it), so the prefill step,
  AIC's TTFT / that factor, is what is compared against trtpd's TTFT.

Exit status 1 when any compared figure is outside --tolerance (default 10%), 2 when .venv-aic is missing.

Run: .venv/bin/python benchmarks/aic_reproduce.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trtpd.catalog import ModelSpec
from trtpd.errors import ConfigError
from trtpd.perf.aiconfigurator import (AicComposer, AicSystem, aic_python, database_root, export_database,
                                       profile_from_aiconfigurator)
from trtpd.perf.hardware import load_hardware
from trtpd.perf.model import instance_perf
from trtpd.planner.colocated import ColocatedCandidate, static_point
from trtpd.planner.estimate import bisect_max
from trtpd.planner.role_models import WorkloadStats
from trtpd.sim.colocated_instance import mixed_step_s
from trtpd.sim.lengths import LengthStats

SCENARIO = dict(model="Qwen/Qwen3-32B", system="h200_sxm", tp=2, batch=64, isl=2048, osl=512)
HARDWARE = {"h200_sxm": "h200", "h100_sxm": "h100-sxm", "a100_sxm": "a100-80g"}

# Runs in .venv-aic: AIConfigurator's answer (API for static and agg, the CLI for agg) as one JSON line.
AIC_SIDE = r'''
import json, logging, re, subprocess, sys, warnings
from importlib import metadata
from pathlib import Path
logging.disable(logging.WARNING)
warnings.filterwarnings("ignore")
import aiconfigurator_core
from aiconfigurator.cli.api import cli_estimate
sc = json.loads(sys.argv[1])
out = {"versions": {p: metadata.version(p) for p in ("aiconfigurator", "aiconfigurator-core")}}
cfg = Path(aiconfigurator_core.__file__).parent / "model_configs" / (sc["model"].replace("/", "--") + "_config.json")
out["model_config"] = json.loads(cfg.read_text())
for mode in ("static", "agg"):
    r = cli_estimate(sc["model"], sc["system"], mode=mode, batch_size=sc["batch"], isl=sc["isl"], osl=sc["osl"],
                     tp_size=sc["tp"])
    raw = {k: (v.item() if hasattr(v, "item") else v) for k, v in r.raw.items()}
    res = {"ttft_ms": float(r.ttft), "tpot_ms": float(r.tpot), "tokens_s_gpu": float(raw["tokens/s/gpu"]),
           "version": r.backend_version, "raw": raw}
    if mode == "static":
        res["context_ops_ms"] = dict(r.summary.get_context_latency_dict())
        res["generation_ops_ms"] = dict(r.summary.get_generation_latency_dict())
    else:
        res["per_ops_ms"] = r.per_ops_data
    out[mode] = res
cmd = [str(Path(sys.executable).with_name("aiconfigurator")), "cli", "estimate", "--model-path", sc["model"],
       "--system", sc["system"], "--tp-size", str(sc["tp"]), "--batch-size", str(sc["batch"]),
       "--isl", str(sc["isl"]), "--osl", str(sc["osl"])]
proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
text = proc.stdout + proc.stderr
def field(name):
    m = re.search(r"^\s*" + re.escape(name) + r":\s+([\d,.]+)", text, re.M)
    return float(m.group(1).replace(",", "")) if m else None
out["cli"] = {"command": " ".join(["aiconfigurator"] + cmd[1:]), "rc": proc.returncode,
              "ttft_ms": field("TTFT"), "tpot_ms": field("TPOT"), "tokens_s_gpu": field("tokens/s/gpu"),
              "tail": text[-1500:] if proc.returncode else ""}
print(json.dumps(out, default=str))
'''

# AIC's static-mode operators -> trtpd's (AicComposer.context_ops_ms / decode_ops_ms); the rest are AIC's only
AIC_OPS = {"qkv_gemm": ("qkv_gemm",), "proj_gemm": ("proj_gemm",), "gate_ffn1_gemm": ("gate_ffn1_gemm",),
           "ffn2_gemm": ("ffn2_gemm",), "attention": ("attention",), "all_reduce": ("ar_1", "ar_2"),
           "logits_gemm": ("logits_gemm",)}


def run_aic(python: Path, scenario: dict) -> dict:
    proc = subprocess.run([str(python), "-c", AIC_SIDE, json.dumps(scenario)], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"AIConfigurator failed in {python}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def model_from_config(cfg: dict, name: str) -> ModelSpec:
    """Qwen3 (and Llama) dense decoder from the Hugging Face config.json AIC ships for the checkpoint."""
    heads = int(cfg["num_attention_heads"])
    return ModelSpec(name=name, num_layers=int(cfg["num_hidden_layers"]), hidden_size=int(cfg["hidden_size"]),
                     num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
                     head_size=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
                     intermediate_size=int(cfg["intermediate_size"]), vocab_size=int(cfg["vocab_size"]),
                     max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                     tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), hf_id=name)


def trtpd_static(c: AicComposer, sc: dict) -> dict:
    ctx = c.context_ops_ms(sc["batch"], sc["isl"])
    steps = [c.decode_ops_ms(sc["batch"], sc["isl"] + i + 1) for i in range(sc["osl"] - 1)]
    gen = {op: sum(s[op] for s in steps) for op in steps[0]}
    ttft, tpot = sum(ctx.values()), sum(gen.values()) / len(steps)
    latency_s = (ttft + tpot * (sc["osl"] - 1)) / 1e3
    return {"ttft_ms": ttft, "tpot_ms": tpot, "tokens_s_gpu": sc["batch"] * sc["osl"] / latency_s / sc["tp"],
            "context_ops_ms": ctx, "generation_ops_ms": gen}


def trtpd_agg(model: ModelSpec, sc: dict, system: AicSystem) -> dict:
    """In-flight batching at `batch` sequences in flight on the hardware profile's curves (what the planner and
    the simulator read), two ways:
    * whole prompts: without chunking a prompt (ISL <= the step budget) enters one step whole, so b / OSL of
      the steps carry a prompt next to b - 1 decode rows and the rest are decode steps of b; TPOT is the mean
      step, TTFT (no queueing) the prompt's step;
    * trtpd.planner.colocated.static_point, the planner's estimate (whole prompts too, with the share of steps
      that carry one from its fixed point), at the rate that keeps `batch` in flight."""
    measured = profile_from_aiconfigurator(system, model, sc["tp"], "bf16", "bf16")
    hw = load_hardware(HARDWARE[sc["system"]]).model_copy(update={"measured": [measured]})
    inst = instance_perf(model, hw, sc["tp"], "bf16", "bf16")
    perf, b, isl, osl = inst.perf, sc["batch"], sc["isl"], sc["osl"]
    ctx = isl + osl // 2                      # the mean context over a request's decode steps
    prompt_step = mixed_step_s(perf, isl, isl * isl, b - 1, (b - 1) * ctx)
    decode_step = perf.decode_step_s(b, b * ctx)
    share = min(1.0, b / osl)                 # steps that carry a prompt
    step = share * prompt_step + (1 - share) * decode_step
    whole = {"ttft_ms": prompt_step * 1e3, "tpot_ms": step * 1e3,
             "tokens_s_gpu": b * (osl - 1) / (osl * step) / sc["tp"], "prompt_step_ms": prompt_step * 1e3,
             "decode_step_ms": decode_step * 1e3, "prompt_share": share}

    cand = ColocatedCandidate(sc["tp"], "inflight", inst, b, isl + b)
    fixed = lambda n: LengthStats(n, n * n, n, n, n, n)  # noqa: E731 - fixed lengths
    stats = WorkloadStats(fixed(float(isl)), fixed(float(osl)))

    def fits(rate: float) -> bool:
        pt = static_point(cand, stats, rate, 0.5)
        return pt is not None and pt.batch <= b
    rate = bisect_max(fits, 100.0)
    pt = static_point(cand, stats, rate, 0.5)
    assert pt is not None
    planner = {"ttft_ms": pt.ttft_s * 1e3, "tpot_ms": pt.step_s * 1e3, "tokens_s_gpu": rate * (osl - 1) / sc["tp"],
               "batch": pt.batch, "rate_per_s": rate}
    return {"whole_prompts": whole, "static_point": planner, "source": inst.source}


def queueing_factor(sc: dict, ctx_tokens: int) -> float:
    """AIC 0.12's TensorRT-LLM agg TTFT factor (aiconfigurator_core/sdk/backends/base_backend.py)."""
    return min(2 + (math.ceil(sc["isl"] * sc["batch"] / ctx_tokens) - 3) / 2 / 10, 4)


def outside(rows: list[tuple[str, str, float, float]], tolerance: float) -> list[str]:
    """The compared figures (mode, name, AIC, trtpd) whose ratio is off by more than tolerance."""
    return [f"{mode} {name}" for mode, name, a, t in rows if not (a > 0 and abs(t / a - 1) <= tolerance)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aic-venv", type=Path, default=None, help="AIConfigurator's venv (default .venv-aic)")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    sc = dict(SCENARIO)
    try:
        python = aic_python(args.aic_venv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    aic = run_aic(python, sc)
    t_aic = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="trtpd-aic-") as tmp:
        export = export_database(sc["system"], Path(tmp), python, ops=("gemm", "attention", "comm"))
        system = AicSystem(database_root(Path(tmp)), sc["system"], version=aic["static"]["version"])
        model = model_from_config(aic["model_config"], sc["model"])
        composer = AicComposer(system, model, sc["tp"], "bf16", "bf16")
        ours_static = trtpd_static(composer, sc)
        ours_agg = trtpd_agg(model, sc, system)
    t_all = time.perf_counter() - t0

    sched = aic["agg"]["per_ops_ms"]["scheduling"]
    factor = queueing_factor(sc, int(sched["mix_context_tokens"]))
    aic_prefill_step = aic["agg"]["ttft_ms"] / factor
    whole, planner = ours_agg["whole_prompts"], ours_agg["static_point"]
    rows = [("static", "TTFT ms (64 x 2048 context pass)", aic["static"]["ttft_ms"], ours_static["ttft_ms"]),
            ("static", "TPOT ms (mean decode step)", aic["static"]["tpot_ms"], ours_static["tpot_ms"]),
            ("static", "tokens/s/GPU", aic["static"]["tokens_s_gpu"], ours_static["tokens_s_gpu"]),
            ("agg", f"TTFT / queueing factor {factor:.2f} (prompt step) ms", aic_prefill_step, whole["ttft_ms"]),
            ("agg", "TPOT ms", aic["agg"]["tpot_ms"], whole["tpot_ms"]),
            ("agg", "tokens/s/GPU", aic["agg"]["tokens_s_gpu"], whole["tokens_s_gpu"]),
            ("agg", "TPOT ms, planner's static_point", aic["agg"]["tpot_ms"], planner["tpot_ms"]),
            ("agg", "tokens/s/GPU, planner's static_point", aic["agg"]["tokens_s_gpu"], planner["tokens_s_gpu"])]
    info = [("agg", "TTFT ms as AIC reports it", aic["agg"]["ttft_ms"], whole["ttft_ms"])]
    cli = aic["cli"]
    cli_ok = cli["rc"] == 0 and all(cli[k] is not None and abs(cli[k] - aic["agg"][k]) <= 0.01 * abs(aic["agg"][k])
                                    for k in ("ttft_ms", "tpot_ms", "tokens_s_gpu"))

    v = aic["versions"]
    print(f"AIConfigurator {v['aiconfigurator']} (aiconfigurator-core {v['aiconfigurator-core']}) "
          f"in {python.parent.parent}, "
          f"database {sc['system']} trtllm {aic['static']['version']}; trtpd reads the same tables "
          f"({sum(export['tables'].values()):,} rows exported to CSV)")
    print(f"scenario (AIC docs, cli_user_guide.md 'Estimate mode'): {sc['model']} on {sc['system']}, TP{sc['tp']}, "
          f"batch {sc['batch']}, ISL {sc['isl']}, OSL {sc['osl']}, bf16 GEMMs/KV/FMHA")
    print(f"AIC's CLI: {cli['command']}")
    print(f"  -> TTFT {cli['ttft_ms']} ms, TPOT {cli['tpot_ms']} ms, {cli['tokens_s_gpu']} tokens/s/gpu "
          f"({'equal to its Python API' if cli_ok else 'DIFFERS from its Python API or failed'})")
    if not cli_ok and cli.get("tail"):
        print(cli["tail"])
    print(f"trtpd agg: {ours_agg['source']}; whole prompts: {whole['prompt_share']:.3f} of the steps carry one "
          f"({whole['prompt_step_ms']:.2f} ms, AIC {sched['mix_step_latency_ms']:.2f}), the rest decode "
          f"{sc['batch']} ({whole['decode_step_ms']:.2f} ms, AIC {sched['genonly_step_latency_ms']:.2f})")
    print()
    print(f"{'mode':<7}{'figure':<46}{'AIC':>11}{'trtpd':>11}{'trtpd/AIC':>11}")
    bad = outside(rows, args.tolerance)
    for mode, name, a, t in rows:
        flag = "   <-- outside tolerance" if f"{mode} {name}" in bad else ""
        print(f"{mode:<7}{name:<46}{a:>11.2f}{t:>11.2f}{t / a:>11.3f}{flag}")
    print("not compared (see the notes below):")
    for mode, name, a, t in info:
        print(f"{mode:<7}{name:<46}{a:>11.2f}{t:>11.2f}{t / a:>11.3f}")
    print(f"* AIC's agg TTFT = its prompt step x {factor:.2f}, a queueing heuristic for a batch that arrives at once; "
          f"trtpd's static estimates have no queueing (the simulator has it)")
    print(f"* AIC's agg TPOT averages {sched['num_mix_steps']:.0f} - 3 prompt steps (its TensorRT-LLM 'pipeline "
          f"drain' correction) with {sched['num_genonly_steps']:.0f} decode steps; trtpd's mean step counts "
          f"all of them")
    print(f"* the planner's static_point takes prompts whole, as in-flight batching without chunking does: "
          f"{planner['rate_per_s']:.3f} requests/s keep {planner['batch']:.1f} in flight, and that share of its "
          f"steps carries a prompt")
    print("\nstatic mode by operator (ms; context pass, and all 511 decode steps together):")
    print(f"{'operator':<22}{'AIC ctx':>10}{'trtpd':>10}{'ratio':>7}{'AIC gen':>11}{'trtpd':>10}{'ratio':>7}")
    actx, agen = dict(aic["static"]["context_ops_ms"]), dict(aic["static"]["generation_ops_ms"])
    for op, names in AIC_OPS.items():
        a_c = sum(actx.pop(f"context_{n}", 0.0) for n in names)
        a_g = sum(agen.pop(f"generation_{n}", 0.0) for n in names)
        t_c, t_g = ours_static["context_ops_ms"][op], ours_static["generation_ops_ms"][op]
        print(f"{op:<22}{a_c:>10.1f}{t_c:>10.1f}{t_c / a_c if a_c else 0:>7.3f}{a_g:>11.1f}{t_g:>10.1f}"
              f"{t_g / a_g if a_g else 0:>7.3f}")
    for op in sorted({k.split("_", 1)[1] for k in (*actx, *agen)}):
        print(f"{op + ' (AIC only)':<22}{actx.get('context_' + op, 0.0):>10.1f}{'-':>10}{'':>7}"
              f"{agen.get('generation_' + op, 0.0):>11.1f}{'-':>10}")
    only_c, only_g = sum(actx.values()), sum(agen.values())
    print(f"AIC-only operators: {only_c:.1f} ms of the context pass ({only_c / aic['static']['ttft_ms']:.1%}), "
          f"{only_g:.1f} ms of decode ({only_g / aic['static']['raw']['generation_latency']:.1%}); AIC estimates "
          f"them from speed-of-light formulas with empirical factors (its 'empirical' source), not from the "
          f"measured tables, and trtpd's operator sum leaves them out")
    print(f"\nAIC {t_aic:.1f} s, total {t_all:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"scenario": sc, "aic": aic, "trtpd_static": ours_static,
                                         "trtpd_agg": ours_agg, "rows": rows, "cli_ok": cli_ok}, default=str))
    if bad or not cli_ok:
        print(f"FAIL: outside {args.tolerance:.0%}: {', '.join(bad) or '-'}; CLI consistent: {cli_ok}")
        return 1
    print(f"OK: every compared figure within {args.tolerance:.0%} of AIConfigurator's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
