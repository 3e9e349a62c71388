"""Simulation vs reality over a grid: the same requests through the real deployments and through the simulator.

1. profile the reference engine on this machine (`trtpd profile --serving` into a temporary hardware file),
2. for each workload (default: cpu-demo, short outputs; cpu-powerlaw-long, long outputs; cpu-bursty, long outputs
   with bursty arrivals) and mode (disaggregated 1P1D, colocated 2 instances), start the real tritonserver
   deployment once and run each rate through it (same requests, streaming over gRPC),
3. simulate exactly those requests (arrivals and lengths) on clusters that mirror the engines' scheduler
   settings and KV pools and the deployment's routing (Triton gives the colocated instance group's requests to
   its instances in turn: trtpd.sim.fidelity.mirrored_clusters), with the measured curves,
4. print each cell's TTFT and TPOT at P50/P90/P99 and goodput (requests/s meeting the SLO) real vs simulated with
   the relative error, and the mean absolute percentage error (MAPE) per workload (goal: every P50/P90 and
   goodput within 15%; BLIS's published MAPE is 11.8% E2E). ITL is not compared: the simulator records a
   request's first and last token, not each token.
5. checks this machine's engine speed against the profile's around each deployment (a few of the profile's
   shapes timed again in-process before it starts and after it stops, trtpd.engine.profiling.speed_ratio) and
   prints the MAPE a second time with each deployment's cells simulated at that speed (the curves scaled, the
   serving costs as measured): how much of the error is the machine's speed moving between the profile and the run,
6. --record FILE: also writes the run (the measured profile, the engines' options, each cell's requests and real
   latencies, the MAPE per workload) as a FidelityRecord (trtpd/sim/fidelity.py), which
   tests/unit/sim/test_fidelity_record.py holds the simulator against on any machine,
7. --account: where each cell's mean TTFT goes, real against simulated, term by term: the engines' own TTFT
   breakdown (prefill queue, prefill compute, decode queue, KV transfer: the perf outputs each real request
   carries, the simulator's TtftBreakdown) and the rest (the serving path: client, ensemble, pre/post-processing,
   the entry's hops; the simulator's response latency), and the mean TPOT,
8. --step-trace DIR: the engines trace their steps (trtpd/engine/step_trace.py), and each cell's forward passes are
   held against the perf model by shape, alone and beside another engine's (benchmarks/step_account.py).
Run: .venv/bin/python benchmarks/validate_sim.py [--workloads cpu-demo,...] [--rates 1,2,3] [--num-requests 40]
     [--account] [--step-trace DIR] [--record tests/golden/fidelity/record.json]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

import step_account   # benchmarks/step_account.py, beside this script

from trtpd.bench.run import bench_url, make_requests
from trtpd.bench.serving_probe import warm_every_instance
from trtpd.catalog import get_model
from trtpd.engine import step_trace
from trtpd.engine.checkpoint import load_checkpoint
from trtpd.engine.profiling import speed_ratio
from trtpd.engine.reference_engines import build_reference
from trtpd.fleet import deployment
from trtpd.perf.hardware import curves_origin, load_hardware
from trtpd.perf.measured import MeasuredPerfModel
from trtpd.repo.reference import ReferenceDeployment
from trtpd.sim.cluster_specs import ClusterOptions, options_from_engines
from trtpd.sim.fidelity import (GOAL, MODES, FidelityRecord, RecordedCell, beyond_goal, cell_rows, mape,
                                 mirrored_clusters, real_latencies, simulate_record, worst_decisive)
from trtpd.sim.metrics import Latencies, latencies, summarize
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import generate_requests, load_workload


SPEED_REPEATS = 30        # the speed check around each deployment: ~3 s
COLOCATED_INSTANCES = 2   # the colocated deployment: one tritonserver, this many instances of the colocated model

# (term, the real request's perf output, the simulator's TtftBreakdown field)
TTFT_TERMS = (("prefill queue", "prefill_queue_ms", "prefill_queue_s"),
              ("prefill compute", "prefill_compute_ms", "prefill_compute_s"),
              ("decode queue", "decode_queue_ms", "decode_queue_s"),
              ("KV transfer", "kv_transfer_ms", "kv_transfer_s"))


def real_terms_ms(results) -> dict[str, float]:
    """Mean ms of each TTFT term over the real requests that have a first token; "rest" is TTFT minus them."""
    done = [r for r in results if r.error is None and r.ttft_s is not None]
    terms = {name: float(np.mean([r.perf.get(key, 0.0) for r in done])) for name, key, _ in TTFT_TERMS}
    ttft = float(np.mean([r.ttft_s for r in done])) * 1e3
    tpot = [r.tpot_s for r in done if r.tpot_s is not None]
    return {**terms, "rest": ttft - sum(terms.values()), "TTFT": ttft,
            "TPOT": float(np.mean(tpot)) * 1e3 if tpot else float("nan")}


def sim_terms_ms(run) -> dict[str, float]:
    summary, lat = summarize(run, warmup_fraction=0.0), latencies(run, warmup_fraction=0.0)
    b = summary.ttft_breakdown
    terms = {name: (getattr(b, field) * 1e3 if b else 0.0) for name, _, field in TTFT_TERMS}
    ttft = float(np.nanmean(lat.ttft_s)) * 1e3
    return {**terms, "rest": ttft - sum(terms.values()), "TTFT": ttft, "TPOT": float(np.nanmean(lat.tpot_s)) * 1e3}


def measure_real(root: Path, workloads: list[str], rates: list[float], requests: dict, curves) -> tuple:
    """Each workload through a real deployment of each mode, its rates one after another: the real latencies and
    TTFT terms by cell, each cell's span of time.monotonic() (for --step-trace), and the machine's engine speed
    against the profile around each deployment, by (workload, mode)."""
    real: dict[tuple, Latencies] = {}
    real_terms: dict[tuple, dict[str, float]] = {}
    windows: dict[tuple, tuple[float, float]] = {}
    speed: dict[tuple, float] = {}
    raw: dict[tuple, list] = {}
    for workload in workloads:
        for mode in MODES:
            before = speed_ratio(root / "colocated-tp1", curves, SPEED_REPEATS)
            dep = deployment.up(f"validate-{mode}", ReferenceDeployment(root, mode=mode,
                                                                        colocated_instances=COLOCATED_INSTANCES),
                                replace=True)
            try:
                first = requests[(workload, rates[0])][0]
                bench_url(dep.server.grpc_url, [replace(first, request_id="warmup", send_at_s=0.0)], "warmup")
                # every instance runs the workload's longest prompt once (its first pass over it is ~2x slower)
                longest = max((r for rate in rates for r in requests[(workload, rate)]),
                              key=lambda r: r.num_prompt_tokens)
                warm_every_instance(dep.server.grpc_url, longest.prompt,
                                    COLOCATED_INSTANCES if mode == "colocated" else 1, max_tokens=2)
                for rate in rates:
                    started = time.monotonic()
                    results = bench_url(dep.server.grpc_url, requests[(workload, rate)], f"{mode} {rate:g}/s")
                    windows[(workload, rate, mode)] = (started, time.monotonic())
                    errors = [r.error for r in results if r.error]
                    if errors:
                        print(f"{workload} {mode} {rate:g}/s: {len(errors)} errors, e.g. {errors[0]}")
                    real[(workload, rate, mode)] = real_latencies(results)
                    raw[(workload, rate, mode)] = results
                    real_terms[(workload, rate, mode)] = real_terms_ms(results)
            finally:
                deployment.down(dep.name)
            after = speed_ratio(root / "colocated-tp1", curves, SPEED_REPEATS)
            speed[(workload, mode)] = float(np.sqrt(before * after))
            print(f"{workload} {mode}: this machine's engine speed against the profile's: x{before:.2f} before the "
                  f"deployment, x{after:.2f} after (above 1: slower)")
    return real, real_terms, windows, speed, raw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="cpu-demo,cpu-powerlaw-long,cpu-bursty")
    ap.add_argument("--rates", default="1,2,3", help="requests per second, light load to colocated saturation")
    ap.add_argument("--num-requests", type=int, default=40, help="per cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ttft-slo-s", type=float, default=1.0)
    ap.add_argument("--tpot-slo-s", type=float, default=0.04)
    ap.add_argument("--engines-dir", type=Path, default=Path("engines"))
    ap.add_argument("--profile", type=Path, help="hardware YAML with measured curves and serving overhead "
                    "(default: measure this machine now with `trtpd profile --serving`)")
    ap.add_argument("--kv-link-bytes-per-s", type=float, default=10e9, help="shm transfer bandwidth")
    ap.add_argument("--account", action="store_true", help="also print each cell's mean TTFT term by term")
    ap.add_argument("--record", type=Path, help="write the run here (a FidelityRecord, JSON)")
    ap.add_argument("--step-trace", type=Path, help="the engines trace their steps into this folder "
                    "(trtpd/engine/step_trace.py); each cell's passes are then held against the perf model "
                    "(benchmarks/step_account.py)")
    args = ap.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    rates = [float(r) for r in args.rates.split(",") if r]

    root = build_reference("tiny-llama", args.engines_dir)[0].parent
    hw_path = args.profile
    if hw_path is None:
        hw_path = Path(tempfile.mkdtemp()) / "cpu-measured.yaml"
        print(f"profiling the reference engine into {hw_path} ...", flush=True)
        profiled = subprocess.run([sys.executable, "-m", "trtpd.cli.main", "profile", "--backend", "reference",
                                   "--engine-dir", str(root), "--output", str(hw_path), "--serving"], check=True,
                                  stdout=subprocess.PIPE, text=True)
        for line in profiled.stdout.splitlines():   # what the serving probe measured, for the reader
            if line.lstrip().startswith("serving ("):
                print(line, flush=True)
    hardware = load_hardware(str(hw_path))
    print(f"curves: {curves_origin(hardware, 'tiny-llama')}")
    tokenizer = load_checkpoint(root / "checkpoint").load_tokenizer()
    model = get_model("tiny-llama")
    opts = options_from_engines(root, ClusterOptions(num_colocated=COLOCATED_INSTANCES,
                                                     kv_link_bytes_per_s=args.kv_link_bytes_per_s,
                                                     first_token_at="decode"))
    clusters = mirrored_clusters(model, hardware, opts)

    cells = [(w, r) for w in workloads for r in rates]
    requests = {c: make_requests(tokenizer, c[0], c[1], args.num_requests, args.seed, 2048) for c in cells}
    arrays = {c: generate_requests(load_workload(c[0]), c[1], args.num_requests, args.seed) for c in cells}
    curves = MeasuredPerfModel(hardware.find_measured("tiny-llama", 1, "fp16"))
    # the servers started inside trace their engines (they inherit the environment)
    with step_trace.tracing(args.step_trace) if args.step_trace else contextlib.nullcontext():
        real, real_terms, windows, speed, raw = measure_real(root, workloads, rates, requests, curves)

    print(f"\n{args.num_requests} requests per cell, seed {args.seed}, SLO TTFT <= {args.ttft_slo_s:g} s, "
          f"TPOT <= {args.tpot_slo_s * 1e3:g} ms; simulated with curves from {hw_path}")
    print(f"{'workload':<18} {'rate':>4} {'mode':<14} {'metric':<10} {'real':>9} {'sim':>9} {'error':>7}")
    worst, summary, sim_terms, recorded, sim_ttft_ms, all_rows = 0.0, {}, {}, [], {}, {}
    for workload in workloads:
        rows_of_workload = all_rows[workload] = []
        for rate in rates:
            for mode in MODES:
                run = simulate(clusters[mode], arrays[(workload, rate)])
                sim_terms[(workload, rate, mode)] = sim_terms_ms(run)
                sim = latencies(run, warmup_fraction=0.0)
                sim_ttft_ms[(workload, rate, mode)] = float(np.nanmedian(sim.ttft_s) * 1e3)
                obs = real[(workload, rate, mode)]
                rows = cell_rows(obs, sim, rate, args.ttft_slo_s, args.tpot_slo_s)
                rows_of_workload += rows
                for row in rows:
                    print(f"{workload:<18} {rate:>4g} {mode:<14} {row.name:<10} {row.real:>9.1f} {row.sim:>9.1f} "
                          f"{row.error:>+7.0%}")
                a = arrays[(workload, rate)]
                recorded.append(RecordedCell(workload, rate, mode, list(map(float, a.arrival_s)),
                                             list(map(int, a.input_tokens)), list(map(int, a.output_tokens)),
                                             *_real_lists(obs), speed_ratio=speed[(workload, mode)]))
        summary[workload] = mape(rows_of_workload)
        worst = max(worst, worst_decisive(rows_of_workload))
    print()
    for workload, value in summary.items():
        print(f"MAPE {workload:<18} {value:.1%}")
    beyond, decisive = beyond_goal(all_rows)
    print(f"largest |error| among P50/P90 and goodput: {worst:.0%}; beyond {GOAL:.0%} (the goal: none): {beyond} of "
          f"{decisive} (benchmarks/fidelity_noise.py holds several runs against each other, and pooled)")
    record = FidelityRecord(curves_origin(hardware, "tiny-llama"),
                            datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            "tiny-llama", hw_path.read_text(), asdict(opts), args.ttft_slo_s, args.tpot_slo_s,
                            args.seed, recorded, summary)
    # the same cells with each deployment's curves at the speed checked around it: how much of the error is the
    # machine's speed moving between the profile and the run (the check itself moves by ~10% within seconds)
    followed = simulate_record(record, follow_speed=True)
    print("at each deployment's checked speed: " + ", ".join(f"MAPE {w} {mape(r):.1%}" for w, r in followed.items())
          + f"; largest |error| {max(worst_decisive(r) for r in followed.values()):.0%}")
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        record.save(args.record)
        print(f"recorded into {args.record}")
    if args.account:
        print_account(real_terms, sim_terms)
    if args.step_trace:
        print_step_account(args.step_trace, windows, hardware)
        print_request_path(args.step_trace, raw, clusters, sim_ttft_ms)
    return 0


def print_request_path(folder: Path, raw: dict, clusters: dict, sim_ttft_ms: dict) -> None:
    """Each cell's median TTFT split at the engines' hand-overs (step_account.request_path) beside the simulator's:
    its constant response latency stands for intake plus egress (and, disaggregated, the orchestrator's hop from
    prefill to decode, which the real split counts in "engines"), the rest of its median TTFT for the engines."""
    traces = step_trace.read_trace(folder)
    print("\neach cell's TTFT at the engines' hand-overs, medians in ms: intake = sent -> handed to the first engine, "
          "engines -> the first token handed on, egress -> the client had it; the simulator's response latency "
          "stands for intake + egress")
    for key, results in raw.items():
        workload, rate, mode = key
        path = step_account.request_path(traces, results, mode)
        response_ms = clusters[mode].response_latency_s * 1e3
        if path is None:
            print(f"{workload:<18} {rate:>4g} {mode:<14} no request matched its engines' records")
            continue
        print(f"{workload:<18} {rate:>4g} {mode:<14} intake {path['intake']:6.1f}  engines {path['engines']:6.1f}  "
              f"egress {path['egress']:6.1f}  (TTFT {path['TTFT']:6.1f}; {path['matched']} of {len(results)} "
              f"matched); simulated: response {response_ms:.1f}, engines {sim_ttft_ms[key] - response_ms:.1f} "
              f"(TTFT {sim_ttft_ms[key]:.1f})")


def print_step_account(folder: Path, windows: dict, hardware) -> None:
    measured = hardware.find_measured("tiny-llama", 1, "fp16")
    traces = step_trace.read_trace(folder)
    print("\neach cell's engine passes against the perf model (benchmarks/step_account.py): pass = measured in "
          "LlamaModel.forward, curve = the profile alone, charged = what the simulator charges that shape")
    print(step_account.HEADER)
    curves = MeasuredPerfModel(measured, None)
    charged = {mode: MeasuredPerfModel(measured, measured.serving.get(mode)) for mode in MODES}
    passes = {name: step_account.intervals(records) for name, records in traces.items()}
    for (workload, rate, mode), (t0, t1) in windows.items():
        for name, records in traces.items():
            others = [p for n, p in passes.items() if n != name]
            acc = step_account.account(records, t0, t1, curves, charged[mode], others)
            if acc["passes"]:
                step_account.print_account(f"{workload} {rate:g}/s {mode}", name, acc)


def _real_lists(obs: Latencies) -> tuple[list, list, list]:
    def values(a):
        return [None if np.isnan(v) else float(v) for v in a]
    return values(obs.ttft_s), values(obs.tpot_s), [bool(v) for v in obs.done]


def print_account(real_terms: dict, sim_terms: dict) -> None:
    """Mean ms per term, real and simulated, and what the simulator misses (sim - real) on each."""
    names = [n for n, _, _ in TTFT_TERMS] + ["rest", "TTFT", "TPOT"]
    print("\nmean ms per term, real / simulated (sim - real); rest = TTFT minus the engines' terms")
    print(f"{'workload':<18} {'rate':>4} {'mode':<14} " + " ".join(f"{n:>22}" for n in names))
    for (workload, rate, mode), obs in real_terms.items():
        sim = sim_terms[(workload, rate, mode)]
        cells = [f"{obs[n]:>6.1f}/{sim[n]:>6.1f} ({sim[n] - obs[n]:>+6.1f})" for n in names]
        print(f"{workload:<18} {rate:>4g} {mode:<14} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
