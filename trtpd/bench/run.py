"""Run a workload against a deployment, and the main job (disaggregated vs colocated side by side)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from trtpd.bench.client import BenchRequest, RequestResult, run_stream
from trtpd.bench.options import PROFILE_NAME, DemoOptions
from trtpd.bench.prompts import prompt_with_tokens
from trtpd.bench.stats import BenchSummary, comparison_table, summarize
from trtpd.engine.reference_engines import build_reference
from trtpd.engine.checkpoint import load_checkpoint
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.catalog import get_model
from trtpd.perf.hardware import curves_origin, load_hardware
from trtpd.sim.cluster_specs import options_from_engines
from trtpd.sim.fidelity import Row, cell_rows, fleet_clusters, mape, real_latencies
from trtpd.sim.metrics import latencies
from trtpd.sim.options import ClusterOptions
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import RequestArrays, generate_requests, load_workload


def make_requests(tokenizer, workload: str, rate_per_s: float, num_requests: int, seed: int,
                  max_input_len: int) -> list[BenchRequest]:
    arrays = generate_requests(load_workload(workload), rate_per_s, num_requests, seed)
    start = arrays.arrival_s[0] if len(arrays) else 0.0
    out = []
    for i, (arrival, n_in, n_out) in enumerate(zip(arrays.arrival_s, arrays.input_tokens, arrays.output_tokens)):
        n_in = max(2, min(int(n_in), max_input_len))
        out.append(BenchRequest(f"req-{i}", prompt_with_tokens(tokenizer, n_in, seed=seed * 100_003 + i),
                                int(n_out), arrival - start, n_in))
    return out


def request_arrays(requests: list[BenchRequest]) -> RequestArrays:
    """The simulator's form of the requests as sent: arrival, prompt tokens, output tokens asked for."""
    return RequestArrays([r.send_at_s for r in requests], [r.num_prompt_tokens for r in requests],
                         [r.max_tokens for r in requests])


def profile_machine(build_root: Path, output: Path, console: Console) -> Path:
    """`trtpd profile --serving` on the engines just built (the engine curves, then the serving path through the real
    tritonserver), into `output`; its lines are echoed as they come."""
    console.print(f"  profile: measuring this machine into {output} (about a minute and a half)")
    output.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "trtpd.cli.main", "profile", "--backend", "reference", "--engine-dir",
           str(build_root), "--output", str(output), "--serving"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            console.print(f"  profile: {line.rstrip()}", markup=False, highlight=False)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd[2:])}` failed (exit code {proc.returncode}); its output is above")
    return output


def bench_url(url: str, requests: list[BenchRequest], label: str, console: Console | None = None,
              timeout_s: float = 300.0) -> list[RequestResult]:
    console = console or Console()
    with Progress(TextColumn(f"  {label:<14}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task(label, total=len(requests))
        return run_stream(url, requests, timeout_s=timeout_s, on_done=lambda _: progress.advance(task))


def _through_gateway(name: str, spec: ReferenceDeployment, counts: dict[str, int], requests: list[BenchRequest],
                     model: str, console: Console) -> list[RequestResult]:
    """Starts a fleet (each instance its own tritonserver) behind the gateway, runs the requests through the
    OpenAI API, stops everything."""
    from trtpd.bench.openai_load import run_openai
    from trtpd.fleet.launcher import fleet_down, fleet_up
    from trtpd.fleet.gateway_process import api_key, attach_gateway

    t0 = time.perf_counter()
    fleet = fleet_up(name, spec, replace=True, **counts)
    try:
        attach_gateway(fleet)
        url, key = f"http://127.0.0.1:{fleet.gateway['port']}/v1", api_key(fleet)
        layout = ", ".join(f"{i.name} on cpu {','.join(map(str, i.cpus))}" for i in fleet.instances)
        console.print(f"  {spec.mode}: fleet ready in {time.perf_counter() - t0:.1f} s ({layout}); "
                      f"OpenAI API {url}; warming up")
        run_openai(url, model, [replace(requests[0], request_id="warmup", send_at_s=0.0)], api_key=key)
        with Progress(TextColumn(f"  {spec.mode:<14}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as progress:
            task = progress.add_task(spec.mode, total=len(requests))
            return run_openai(url, model, requests, on_done=lambda _: progress.advance(task), api_key=key)
    finally:
        fleet_down(name)


def run_demo(opts: DemoOptions, console: Console | None = None) -> dict[str, BenchSummary]:
    console = console or Console()
    started = time.perf_counter()
    console.rule("trtpd main job: disaggregated vs colocated on the CPU reference backend")
    dirs = build_reference(opts.model, opts.engines_dir, kv_dtype=opts.kv_dtype, progress=lambda m: console.print(f"  build: {m}"))
    root = dirs[0].parent
    checkpoint = load_checkpoint(root / "checkpoint")
    tokenizer = checkpoint.load_tokenizer()
    requests = make_requests(tokenizer, opts.workload, opts.rate_per_s, opts.num_requests, opts.seed, 2048)
    lens = sorted(r.num_prompt_tokens for r in requests)
    console.print(f"  workload: {len(requests)} requests, Poisson {opts.rate_per_s}/s, prompt tokens "
                  f"{lens[0]}..{lens[-1]} (median {lens[len(lens) // 2]}), "
                  f"{sum(r.max_tokens for r in requests)} output tokens in all")
    hw_path = opts.profile or profile_machine(root, opts.output.parent / PROFILE_NAME, console)
    hardware = load_hardware(str(hw_path))
    console.print(f"  curves: {curves_origin(hardware, opts.model)} ({hw_path})")
    base = ReferenceDeployment(build_root=root, kv_transport=opts.kv_transport,
                               colocated_instances=opts.colocated_instances)
    results: dict[str, list[RequestResult]] = {}
    counts = {"disaggregated": {"prefill": 1, "decode": 1}, "colocated": {"colocated": opts.colocated_instances}}
    for mode in ("disaggregated", "colocated"):
        results[mode] = _through_gateway(f"demo-{mode}", replace(base, mode=mode), counts[mode], requests,
                                         opts.model, console)
    summaries = {mode: summarize(mode, res) for mode, res in results.items()}
    _print(console, summaries, results)
    prediction = predict(opts, root, hardware, requests, results)
    _print_prediction(console, prediction, opts, hw_path)
    console.print(f"  main job took {time.perf_counter() - started:.1f} s")
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    predicted = {"profile": str(hw_path), "curves": curves_origin(hardware, opts.model),
                 **{m: [asdict(r) for r in rows] for m, rows in prediction.items()}}
    opts.output.write_text(json.dumps({**{m: s.to_dict() for m, s in summaries.items()}, "prediction": predicted},
                                      indent=2))
    console.print(f"  results written to {opts.output}")
    return summaries


def predict(opts: DemoOptions, build_root: Path, hardware, requests: list[BenchRequest],
            results: dict[str, list[RequestResult]]) -> dict[str, list[Row]]:
    """The same requests through the simulator, on `hardware`, for each mode's fleet as the demo ran it (every
    instance its own tritonserver, the gateway routing by load): the rows that compare each mode's percentiles and
    goodput with the run's."""
    options = options_from_engines(build_root, ClusterOptions(num_colocated=opts.colocated_instances))
    clusters = fleet_clusters(get_model(opts.model), hardware, options)
    arrays = request_arrays(requests)
    rows = {}
    for mode, res in results.items():
        sim = latencies(simulate(clusters[mode], arrays), warmup_fraction=0.0)
        rows[mode] = cell_rows(real_latencies(res), sim, opts.rate_per_s, opts.ttft_slo_s, opts.tpot_slo_s)
    return rows


def _print_prediction(console: Console, prediction: dict[str, list[Row]], opts: DemoOptions, hw_path: Path) -> None:
    modes = list(prediction)
    table = Table("metric", *(f"{m}: real / simulated" for m in modes),
                  title=f"the simulator on this machine's profile, the same requests")
    for i, row in enumerate(prediction[modes[0]]):
        digits = 2 if row.name == "goodput/s" else 1
        name = row.name if row.name == "goodput/s" else f"{row.name} (ms)"
        table.add_row(name, *(f"{r.real:.{digits}f} / {r.sim:.{digits}f} ({r.error:+.0%})"
                              for r in (prediction[m][i] for m in modes)))
    table.add_row("MAPE", *(f"{mape(prediction[m]):.1%}" for m in modes))
    console.print(table)
    console.print(f"  goodput: requests/s meeting TTFT <= {opts.ttft_slo_s:g} s and TPOT <= {opts.tpot_slo_s * 1e3:g} "
                  f"ms. Plan with this machine's curves: trtpd plan --hardware {hw_path} --model {opts.model} "
                  f"--kv-dtype {opts.kv_dtype} --workload {opts.workload} --max-gpus 2",
                  markup=False, highlight=False)


def _print(console: Console, summaries: dict[str, BenchSummary], results: dict[str, list[RequestResult]]) -> None:
    table = Table("metric", *summaries.keys(), title="through the OpenAI gateway: disaggregated (1 prefill + 1 decode "
                                                     "instance) vs colocated instances, same cores")
    for row in comparison_table(list(summaries.values())):
        table.add_row(*row)
    console.print(table)
    a, b = results["disaggregated"], results["colocated"]
    same = sum(1 for x, y in zip(a, b) if x.error is None and y.error is None and x.text == y.text)
    console.print(f"  greedy outputs identical in both modes: {same}/{len(a)} requests")
