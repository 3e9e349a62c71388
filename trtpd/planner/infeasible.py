"""Answers for infeasible targets: the binding constraint and the nearest value that would work."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trtpd.errors import TrtpdError
from trtpd.perf.model import instance_perf
from trtpd.planner.role_models import DecodeModel

if TYPE_CHECKING:
    from trtpd.planner.search import Planner, SearchResult


def min_ttft_s(planner: "Planner") -> float:
    """TTFT_p of a lone request (no queueing) on the best TP pair."""
    kind, best = planner.link_kind(), math.inf
    for cp in planner.prefills:
        for cd in planner.decodes:
            cfg = planner.config(cp, cd, kind)
            tiny = 1e-6
            wait, own = cp.model.ttft_parts_s(tiny, planner.p)
            best = min(best, wait + own + cfg.decode_side_ttft_s(tiny, planner.p))
    return best


def min_tpot_s(planner: "Planner") -> float:
    """TPOT of one sequence alone on the best decode TP."""
    p, best = planner.problem, math.inf
    for tp in p.space.tp_decode:
        try:
            inst = instance_perf(p.model, p.hardware, tp, p.space.weight_dtype, p.space.kv_dtype)
        except TrtpdError:   # an invalid TP is already listed in `rejected`
            continue
        best = min(best, DecodeModel(inst, planner.stats, 1).step_s(1.0))
    return best


def no_candidates(planner: "Planner", result: "SearchResult") -> "SearchResult":
    roles = {r.role for r in planner.rejected}
    if not planner.decodes and any(r.reason.startswith("TPOT") for r in planner.rejected):
        result.binding_constraint = "tpot"
        result.nearest_feasible = {"tpot_s": min_tpot_s(planner)}
    else:
        result.binding_constraint = "memory"
    result.notes.append("no usable TP for " + " and ".join(sorted(roles)) + ": see rejected")
    return result


def infeasible_rate(planner: "Planner", result: "SearchResult", failures: dict[str, int]) -> "SearchResult":
    binding = max(failures, key=failures.get) if failures else "unknown"
    result.binding_constraint = binding
    if binding == "ttft":
        result.nearest_feasible = {"ttft_s": min_ttft_s(planner)}
    elif binding == "tpot":
        result.nearest_feasible = {"tpot_s": min_tpot_s(planner)}
    elif binding == "instances":
        limit = planner.problem.space.max_instances_per_role
        result.notes.append(f"the rate needs more than {limit} instances of a role (max_instances_per_role)")
    return result
