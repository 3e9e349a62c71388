"""Where a real run's engine time goes, step by step, against the perf model the simulator steps with.

Reads the step traces the reference engines write with TRTPD_STEP_TRACE_DIR set (trtpd/engine/step_trace.py) and,
for a window of time (one validate_sim cell), sorts each engine's forward passes by shape (prefill only, decode
only, both in one pass) and holds each pass against the perf model at that shape:
- "forward": the pass as timed inside LlamaModel.forward, against the profile's curves alone (the forward pass
  the profile timed, prefill scale 1, no serving costs),
- "model": what the simulator charges a step of that shape (the curves with the measured serving costs: prefill
  scale, step cost and per-sequence cost; trtpd/perf/measured.py),
- "alone" / "beside others": the pass over the curve (median) when no other engine computed during most of it,
  and when another did (the host's sharing: the simulator's shared cores slow a step only when the host's demand
  exceeds its cores), and "on core": the engine thread's CPU time over the pass (below 1: the thread waited, for
  a core or for its process's GIL; at 1 a slow pass computed slowly),
- "turn": the engine loop's whole turn for the step (scheduling, the pass, sampling, handing outputs on), and the
  "gap" before the next turn when the engine stayed busy (waiting for the GIL, the loop's own bookkeeping): the
  simulator starts the next step the moment one ends.
Used by benchmarks/validate_sim.py --step-trace; run alone on a trace folder with a hardware profile:
    .venv/bin/python benchmarks/step_account.py TRACE_DIR PROFILE.yaml [--mode colocated]
"""

from __future__ import annotations

import argparse
import bisect
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trtpd.engine.step_trace import BUSY_GAP_S, shape_of
from trtpd.perf.measured import MeasuredPerfModel

BUSY_OTHERS = 0.5   # a pass that overlaps other engines' passes for more than this fraction of it ran beside them


@dataclass
class ShapeStats:
    passes: int = 0
    forward_s: list = field(default_factory=list)     # measured pass
    curve_s: list = field(default_factory=list)       # profile curves alone
    model_s: list = field(default_factory=list)       # what the simulator charges
    batch: list = field(default_factory=list)         # decode rows in the pass
    beside: list = field(default_factory=list)        # ran beside another engine's pass (BUSY_OTHERS)
    on_core: list = field(default_factory=list)       # the engine thread's CPU over the pass (1: never off a core)


def charge_s(perf: MeasuredPerfModel, kind: str, tokens: int, sum_sq: int, batch: int, ctx: int) -> float:
    if kind == "prefill":
        return perf.prefill_s(tokens, sum_sq)
    if kind == "decode":
        return perf.decode_step_s(batch, ctx)
    return perf.prefill_s(tokens, sum_sq) + perf.decode_step_s(batch, ctx)   # the reference engine's mixed step


def intervals(records: list[dict]) -> list[tuple[float, float]]:
    return sorted((r["t_s"], r["t_s"] + r["dt_s"]) for r in records if r["kind"] == "forward")


def overlap_fraction(start: float, end: float, others: list[list[tuple[float, float]]]) -> float:
    """How much of [start, end] other engines' passes cover (summed over engines, so up to their number)."""
    covered = 0.0
    for passes in others:
        i = bisect.bisect_left(passes, (start - 10.0,))   # no pass is longer than 10 s
        while i < len(passes) and passes[i][0] < end:
            covered += max(0.0, min(end, passes[i][1]) - max(start, passes[i][0]))
            i += 1
    return covered / (end - start) if end > start else 0.0


def account(records: list[dict], t0: float, t1: float, curves: MeasuredPerfModel, model: MeasuredPerfModel,
            others: list[list[tuple[float, float]]] = ()) -> dict:
    """One engine's passes and turns in [t0, t1]; `others`: the other engines' pass intervals (intervals())."""
    shapes: dict[str, ShapeStats] = {}
    for r in records:
        if r["kind"] != "forward" or not t0 <= r["t_s"] <= t1:
            continue
        kind, tokens, sum_sq, batch, ctx = shape_of(r["rows"])
        s = shapes.setdefault(kind, ShapeStats())
        s.passes += 1
        s.forward_s.append(r["dt_s"])
        s.curve_s.append(charge_s(curves, kind, tokens, sum_sq, batch, ctx))
        s.model_s.append(charge_s(model, kind, tokens, sum_sq, batch, ctx))
        s.batch.append(batch)
        s.beside.append(overlap_fraction(r["t_s"], r["t_s"] + r["dt_s"], list(others)) > BUSY_OTHERS)
        s.on_core.append(r["cpu_s"] / r["dt_s"] if r.get("cpu_s") is not None and r["dt_s"] > 0 else float("nan"))
    steps = [r for r in records if r["kind"] == "step" and t0 <= r["t_s"] <= t1]
    turns = [r["dt_s"] + r["emit_s"] for r in steps]
    gaps = [b["t_s"] - (a["t_s"] + a["dt_s"] + a["emit_s"]) for a, b in zip(steps, steps[1:])]
    busy_gaps = [g for g in gaps if 0 <= g < BUSY_GAP_S]
    return {"shapes": shapes, "steps": len(steps), "turn_s": float(np.sum(turns)) if turns else 0.0,
            "emit_s": float(np.sum([r["emit_s"] for r in steps])) if steps else 0.0,
            "forward_s": float(sum(np.sum(s.forward_s) for s in shapes.values())),
            "busy_gap_s": float(np.sum(busy_gaps)) if busy_gaps else 0.0, "busy_gaps": len(busy_gaps),
            "passes": sum(s.passes for s in shapes.values())}


def _ratio(s: ShapeStats, beside: bool) -> str:
    """The passes' median time over the curve, their number, and the engine thread's median share of a core."""
    sel = [(f / c, o) for f, c, b, o in zip(s.forward_s, s.curve_s, s.beside, s.on_core) if b == beside and c > 0]
    if not sel:
        return f"{'-':>5} ({0:>4}) {'-':>4}"
    return f"{np.median([r for r, _ in sel]):>5.2f} ({len(sel):>4}) {np.median([o for _, o in sel]):>4.2f}"


def print_account(label: str, engine: str, acc: dict) -> None:
    for kind, s in sorted(acc["shapes"].items()):
        f, c, m = (float(np.mean(x)) * 1e3 for x in (s.forward_s, s.curve_s, s.model_s))
        print(f"{label:<34} {engine:<20} {kind:<8} {s.passes:>6} {np.mean(s.batch):>6.2f} {f:>8.2f} {c:>8.2f} "
              f"{m:>8.2f} {f / c - 1:>+7.0%} {m / f - 1:>+7.0%}  {_ratio(s, False):>25}  {_ratio(s, True):>22}")
    if acc["steps"]:
        other = (acc["turn_s"] - acc["forward_s"] - acc["emit_s"]) / acc["steps"] * 1e3
        print(f"{label:<34} {engine:<20} per turn: {acc['steps']} turns, outside the pass {other:.2f} ms, handing "
              f"on {acc['emit_s'] / acc['steps'] * 1e3:.2f} ms, gap to the next busy turn "
              f"{acc['busy_gap_s'] / max(1, acc['busy_gaps']) * 1e3:.2f} ms ({acc['busy_gaps']} gaps)")


def request_path(traces: dict[str, list[dict]], results, mode: str) -> dict[str, float] | None:
    """Each request's TTFT split at the engines' traced hand-overs (their "submit" and "first" records): intake (the
    client sent it -> the serving path handed it to its first engine), engines (-> the engine that answers the
    first token, decode or colocated, handed that token on), egress (-> the client had it). A request is matched to
    the first hand-over of its prompt length after it was sent (disaggregated: then decode's after prefill's).
    Medians in ms and the number matched; None when none was."""
    entry_role, answer_role = ("prefill", "decode") if mode == "disaggregated" else ("colocated", "colocated")

    def records(role: str, kind: str) -> list[dict]:
        return sorted((r for name, recs in traces.items() if name.startswith(f"{role}-") for r in recs
                       if r["kind"] == kind), key=lambda r: r["t_s"])

    entries, answers = records(entry_role, "submit"), records(answer_role, "submit")
    first_s = {r["id"]: r["t_s"] for r in records(answer_role, "first")}
    used: set[int] = set()

    def match(candidates: list[dict], tokens: int, after_s: float) -> dict | None:
        for c in candidates:
            if c["prompt_tokens"] == tokens and c["t_s"] >= after_s and id(c) not in used:
                used.add(id(c))
                return c
        return None

    parts: dict[str, list[float]] = {"intake": [], "engines": [], "egress": [], "TTFT": []}
    for r in results:
        if r.error or not r.token_times_s:
            continue
        entry = match(entries, r.num_prompt_tokens, r.sent_s)
        answer = entry if entry is None or entry_role == answer_role else match(answers, r.num_prompt_tokens,
                                                                                entry["t_s"])
        if answer is None or answer["id"] not in first_s:
            continue
        parts["intake"].append(entry["t_s"] - r.sent_s)
        parts["engines"].append(first_s[answer["id"]] - entry["t_s"])
        parts["egress"].append(r.token_times_s[0] - first_s[answer["id"]])
        parts["TTFT"].append(r.ttft_s)
    if not parts["TTFT"]:
        return None
    return {**{k: float(np.median(v)) * 1e3 for k, v in parts.items()}, "matched": len(parts["TTFT"])}


HEADER = (f"{'cell':<34} {'engine':<20} {'shape':<8} {'passes':>6} {'batch':>6} {'pass ms':>8} {'curve':>8} "
          f"{'charged':>8} {'vs crv':>7} {'chg-pass':>7}  {'pass/curve alone, on core':>25}  "
          f"{'beside others, on core':>22}")


def main() -> int:
    from trtpd.engine.step_trace import read_trace
    from trtpd.perf.hardware import load_hardware

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--mode", default="colocated", choices=("colocated", "disaggregated"),
                    help="whose serving costs the charged column uses")
    args = ap.parse_args()
    measured = load_hardware(str(args.profile)).find_measured(args.model, 1, "fp16")
    curves, model = MeasuredPerfModel(measured, None), MeasuredPerfModel(measured, measured.serving.get(args.mode))
    print(HEADER)
    traces = read_trace(args.trace_dir)
    passes = {name: intervals(records) for name, records in traces.items()}
    for name, records in traces.items():
        others = [p for n, p in passes.items() if n != name]
        print_account("all", name, account(records, 0.0, float("inf"), curves, model, others))
    return 0


if __name__ == "__main__":
    sys.exit(main())
