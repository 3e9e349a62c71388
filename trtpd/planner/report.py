"""Human-readable text for plans and seed 004 answers (the CLI prints these)."""

from __future__ import annotations

from trtpd.schema.plan import Plan
from trtpd.planner.throughput_ratio import Seed004Plan


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def plan_text(plan: Plan) -> str:
    lines = []
    t = plan.target
    target = (f"{t.rate_per_s:.3g} requests/s ({t.tokens_per_min / 1e6:.3g}M tokens/min)" if t.rate_per_s
              else "highest rate within the GPU budget")
    lines.append(f"plan: {plan.model} on {plan.hardware}, {plan.workload.name}, target {target}")
    lines.append(f"  SLO: TTFT <= {_ms(plan.slo.ttft_s)} and TPOT <= {_ms(plan.slo.tpot_s)} "
                 f"for {plan.slo.attainment:.0%} of requests")
    if not plan.feasible:
        nearest = ", ".join(f"{k} = {v:.4g}" for k, v in plan.nearest_feasible.items()) or "none found"
        lines.append(f"  INFEASIBLE: binding constraint {plan.binding_constraint}; nearest feasible: {nearest}")
    if plan.prefill and plan.decode and plan.kv_transfer:
        p, d, kv = plan.prefill, plan.decode, plan.kv_transfer
        label = "plan within the budget" if not plan.feasible else "plan"
        lines.append(f"  {label}: {p.num_instances}P{d.num_instances}D, {plan.num_gpus} GPUs "
                     f"(prefill TP{p.tp} x {p.num_instances}, decode TP{d.tp} x {d.num_instances}); "
                     f"{plan.weight_dtype} weights, {plan.kv_dtype} KV")
        lines.append(f"  prefill: max_num_tokens {p.max_num_tokens}, max_batch_size {p.max_batch_size}, "
                     f"max_input_len {p.max_input_len} ({p.perf_source})")
        lines.append(f"  decode:  max_batch_size {d.max_batch_size}, max_seq_len {d.max_seq_len} ({d.perf_source})")
        lines.append(f"  KV transfer over {kv.link}: {kv.mean_bytes_per_request / 1e6:.1f} MB per request, "
                     f"{_ms(kv.mean_transfer_s)}; {kv.required_bandwidth_bytes_per_s / 1e9:.2f} GB/s needed per "
                     f"decode link of {kv.link_bandwidth_bytes_per_s / 1e9:.0f} GB/s ({kv.link_utilization:.1%})")
        v = plan.verification
        if v is not None and not v.passed and plan.max_rate_per_s <= 0:
            # the analytic model calibrated at an overloaded point (its queue grows without bound) finds no rate
            lines.append(f"  sustains: no rate confirmed (the simulator's check at {v.rate_per_s:.3g} requests/s "
                         f"failed: {v.slo_attainment:.1%} of requests met the SLOs, {plan.slo.attainment:.0%} "
                         f"needed)")
        else:
            lines.append(f"  sustains up to {plan.max_rate_per_s:.3g} requests/s: goodput "
                         f"{plan.goodput_per_gpu_per_s:.3g} requests/s per GPU")
        if plan.expected:
            e = plan.expected
            pct = plan.slo.percentile
            lines.append(f"  expected at the target: P{pct:.0f} TTFT {_ms(e.ttft_p_s)}, P{pct:.0f} TPOT "
                         f"{_ms(e.tpot_p_s)}, mean decode batch {e.decode_batch_mean:.0f}")
        if plan.verification:
            v = plan.verification
            lines.append(f"  simulated ({v.num_requests} requests): TTFT P50/P90/P99 {_ms(v.ttft_s['p50'])} / "
                         f"{_ms(v.ttft_s['p90'])} / {_ms(v.ttft_s['p99'])}; TPOT {_ms(v.tpot_s['p50'])} / "
                         f"{_ms(v.tpot_s['p90'])} / {_ms(v.tpot_s['p99'])}; attainment {v.slo_attainment:.1%} "
                         f"({'pass' if v.passed else 'FAIL'})")
        if plan.seed004 and "num_prefill" in plan.seed004:
            s = plan.seed004
            lines.append(f"  seed 004's first pass on the same curves: {s['num_prefill']:.0f}P{s['num_decode']:.0f}D "
                         f"(P/D ratio {s['pd_ratio']:.2f})")
    if plan.comparison:
        lines += comparison_lines(plan)
    for reason in plan.rejected:
        lines.append(f"  rejected {reason}")
    for note in plan.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def seed004_text(plan: Seed004Plan, input_tokens: float, output_tokens: float, tp_prefill: float,
                 tp_decode: float, ratio: float) -> str:
    per_min = plan.total_tokens_per_s * 60
    lines = [
        f"seed 004: TP_prefill = {tp_prefill:.0f} tokens/s, TP_decode = {tp_decode:.0f} tokens/s, "
        f"P/D ratio = {ratio:.2f}",
        f"  at {per_min / 1e6:.3g}M tokens/min (L_in {input_tokens:.0f}, L_out {output_tokens:.0f}): "
        f"N_prefill = {plan.prefill_instances_exact:.2f} -> {plan.num_prefill}, "
        f"N_decode = {plan.decode_instances_exact:.2f} -> {plan.num_decode}: "
        f"{plan.num_prefill}P{plan.num_decode}D",
        f"  {plan.num_prefill}P{plan.num_decode}D sustains up to {plan.max_tokens_per_min / 1e6:.3f}M tokens/min "
        f"({plan.binding_role} binds)",
    ]
    if (plan.seed_num_prefill, plan.seed_num_decode) != (plan.num_prefill, plan.num_decode):
        lines.append(
            f"  rounding to the nearest (as the seed does) gives {plan.seed_num_prefill}P{plan.seed_num_decode}D, "
            f"which sustains only {plan.seed_max_tokens_per_min / 1e6:.3f}M tokens/min ({plan.seed_binding_role} "
            f"binds): short of the target")
    return "\n".join(lines)


def _cell_tp(side) -> str:
    return ", ".join(f"{role} TP{tp} x {side.num_instances[role]}" for role, tp in side.tp.items())


def _cell_batch(side) -> str:
    return ", ".join(f"{role} {side.max_batch_size[role]} seqs/{side.max_num_tokens[role]} tokens"
                     for role in side.tp)


def _cell_pct(values: dict[str, float]) -> str:
    return " / ".join(f"{values[k] * 1e3:.0f}" for k in ("p50", "p90", "p99")) + " ms" if values else "-"


def comparison_lines(plan: Plan) -> list[str]:
    c = plan.comparison
    assert c is not None
    sides = [("disaggregated", c.disaggregated), ("colocated", c.colocated)]
    rows = [("", lambda s, name: name + (f" ({s.policy})" if s.policy else "")),
            ("GPUs", lambda s, _: str(s.num_gpus)),
            ("TP x instances", lambda s, _: _cell_tp(s)),
            ("batch sizes", lambda s, _: _cell_batch(s)),
            ("goodput (simulated)", lambda s, _: f"{s.goodput_rate_per_s:.3g} req/s = {s.goodput_per_gpu_per_s:.3g}"
                                                 f"/GPU ({s.output_tokens_per_s_per_gpu:.0f} out tok/s/GPU)"),
            ("static estimate", lambda s, _: f"{s.static_rate_per_s:.3g} req/s = {s.static_per_gpu_per_s:.3g}/GPU"),
            ("TTFT P50/P90/P99", lambda s, _: _cell_pct(s.ttft_s)),
            ("TPOT P50/P90/P99", lambda s, _: _cell_pct(s.tpot_s)),
            ("meets the target", lambda s, _: "-" if s.meets_target is None else ("yes" if s.meets_target else "no")),
            ("performance data", lambda s, _: s.perf_source)]
    lines = ["  colocated vs disaggregated (same curves; goodput = highest rate meeting the SLO attainment, "
             "static = no queueing, no KV transfer):"]
    table = [(label, [cell(s, name) if s is not None else ("(none fits)" if not label else "-")
                      for name, s in sides]) for label, cell in rows]
    width = max(54, max(len(cells[0]) for _, cells in table) + 2)   # the left column never runs into the right
    for label, cells in table:
        lines.append(f"    {label:<20} {cells[0]:<{width}} {cells[1]}")
    if c.recommended is None:
        lines.append("  recommendation: none (" + "; ".join(c.reasons) + ")")
        return lines
    by = f"{c.ratio_per_gpu:.2f}x the per-GPU goodput" if c.ratio_per_gpu < 1e9 else "the only one that fits"
    best, other = (c.colocated, c.disaggregated) if c.recommended == "colocated" else (c.disaggregated, c.colocated)
    if plan.target.rate_per_s and best and other and best.num_gpus != other.num_gpus:
        by = f"{best.num_gpus} GPUs instead of {other.num_gpus} for the target; {by}"
    lines.append(f"  recommendation: {c.recommended.upper()}, {by}")
    lines += [f"    why: {r}" for r in c.reasons]
    return lines
