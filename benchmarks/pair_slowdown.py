"""Two colocated instances decoding beside each other, against one instance decoding alone, at several loads.

What the colocated probe (`trtpd profile --serving`, trtpd/bench/serving_probe.fit_shared_demand) fits its line to,
measured directly: for each batch (requests per instance), a deployment of one colocated instance runs that many
requests of 300 output tokens, then a deployment of two instances runs twice as many (Triton hands them out in turn),
both traced (trtpd/engine/step_trace.py). Printed per batch: the median decode period at that batch alone and in the
pair, their ratio (the pair's slowdown), the tokens per second the pair streams alone, and what the simulator's
shared cores would make of it with the serving path's CPU as spent (read from /proc around the lone run) and one
core per step: (2 + CPU per token x tokens/s) / cores. The serving path's CPU is not all taken from the engines:
where the ratio stays below that figure, part of it runs while the engine threads wait anyway.

    .venv/bin/python benchmarks/pair_slowdown.py [--engines-dir engines] [--batches 1 2 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtpd.bench.client import BenchRequest, run_stream                      # noqa: E402
from trtpd.bench.prompts import prompt_with_tokens                           # noqa: E402
from trtpd.bench.serving_probe import PAIR_SPACING_S, PROMPT_TOKENS, serving_cpu_reader   # noqa: E402
from trtpd.deploy.spec import ReferenceDeployment                            # noqa: E402
from trtpd.engine import step_trace                                          # noqa: E402
from trtpd.engine.checkpoint import load_checkpoint                          # noqa: E402
from trtpd.fleet import deployment                                           # noqa: E402

OUTPUT_TOKENS = 300


def _periods(root: Path, instances: int, batch: int, prompts: list[str], trace_dir: Path) -> tuple[list[float], float]:
    """Decode periods at `batch` of `instances` colocated instances each decoding `batch` requests, and the serving
    path's CPU seconds per streamed token meanwhile."""
    with step_trace.tracing(trace_dir):
        dep = deployment.up(f"pair-slowdown-{instances}x{batch}",
                            ReferenceDeployment(root, mode="colocated", colocated_instances=instances), replace=True)
    try:
        run_stream(dep.server.grpc_url, [BenchRequest(f"warmup-{i}", p, 16, 0.0) for i, p in enumerate(prompts)])
        cpu = serving_cpu_reader(dep)
        started, before_s = time.monotonic(), cpu()
        results = run_stream(dep.server.grpc_url, [
            BenchRequest(f"pair-{i}", p, OUTPUT_TOKENS, i * PAIR_SPACING_S)
            for i, p in enumerate((prompts * 2)[:instances * batch])])
        per_token_s = (cpu() - before_s) / (instances * batch * OUTPUT_TOKENS)
        failed = [r.error for r in results if r.error]
        if failed:
            raise SystemExit(f"pair_slowdown: a request failed: {failed[0]}")
    finally:
        deployment.down(dep.name)
    periods = [p for records in step_trace.read_trace(trace_dir).values()
               for b, _, p in step_trace.decode_periods([r for r in records if r["t_s"] >= started]) if b == batch]
    if not periods:
        raise SystemExit(f"pair_slowdown: no decode step at batch {batch} in the trace of {instances} instance(s)")
    return periods, per_token_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines-dir", type=Path, default=Path("engines"))
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    root = args.engines_dir / args.model / "reference-fp16"
    if not (root / "colocated-tp1").is_dir():
        raise SystemExit(f"{root}: no colocated engine; run ./scripts/demo.sh or `trtpd build --backend reference`")
    tokenizer = load_checkpoint(root / "checkpoint").load_tokenizer()
    prompts = [prompt_with_tokens(tokenizer, PROMPT_TOKENS, seed=i) for i in range(max(args.batches))]
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; {OUTPUT_TOKENS} tokens per request, prompts of {PROMPT_TOKENS}")
    print(f"{'batch':>5} {'alone ms':>9} {'pair ms':>8} {'slowdown':>9} {'pair tokens/s':>14} "
          f"{'CPU ms/token':>13} {'CPU as spent makes':>19}")
    with tempfile.TemporaryDirectory(prefix="trtpd-pair-") as tmp:
        for batch in args.batches:
            alone, per_token_s = _periods(root, 1, batch, prompts, Path(tmp) / f"1x{batch}")
            pair, _ = _periods(root, 2, batch, prompts, Path(tmp) / f"2x{batch}")
            alone_s, pair_s = statistics.median(alone), statistics.median(pair)
            tokens_per_s = 2 * batch / alone_s
            spent = max(1.0, (2 + per_token_s * tokens_per_s) / cores)
            print(f"{batch:>5} {alone_s * 1e3:>9.2f} {pair_s * 1e3:>8.2f} {pair_s / alone_s:>8.2f}x "
                  f"{tokens_per_s:>14.0f} {per_token_s * 1e3:>13.2f} {spent:>18.2f}x", flush=True)


if __name__ == "__main__":
    main()
