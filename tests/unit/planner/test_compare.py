"""The side-by-side answer: colocated against disaggregated on the same curves, and the decision rule."""

from pathlib import Path

import pytest

from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.planner.compare import Measured, Side, decide
from trtpd.planner.inputs import SearchSpace, Slo
from trtpd.planner.make import VerifyOptions, make_plan
from trtpd.planner.search import PlanProblem
from trtpd.schema.plan import load_plan
from trtpd.sim.lengths import FixedLengths
from trtpd.sim.workload import load_workload

FAST = VerifyOptions(num_requests=600, compare_requests=600)


def _side(mode, gpus, rate, meets=None):
    return Side(mode, mode, gpus, {}, {}, {}, {}, rate, Measured(rate, None, None), "fake", meets_target=meets)


def test_budget_mode_recommends_the_higher_goodput_and_says_by_how_much():
    v = decide(_side("disaggregated", 8, 40.0), _side("colocated", 8, 60.0), rate=None)
    assert v.recommended == "colocated" and v.ratio_per_gpu == pytest.approx(1.5)


def test_target_mode_recommends_fewer_gpus_among_those_that_meet_it():
    v = decide(_side("disaggregated", 6, 30.0, meets=True), _side("colocated", 8, 48.0, meets=True), rate=25.0)
    assert v.recommended == "disaggregated"            # 6 GPUs beat 8, although 6/GPU > 5/GPU anyway
    v = decide(_side("disaggregated", 6, 30.0, meets=False), _side("colocated", 8, 30.0, meets=True), rate=25.0)
    assert v.recommended == "colocated"
    assert any("does not meet" in r for r in v.reasons)


def _problem(input_tokens, output_tokens, ttft_s, tpot_s, max_gpus=4):
    wl = load_workload("chat-powerlaw").model_copy(update={
        "input_tokens": FixedLengths(kind="fixed", tokens=input_tokens),
        "output_tokens": FixedLengths(kind="fixed", tokens=output_tokens), "name": "fixed"})
    return PlanProblem(get_model("llama-3.1-8b"), load_hardware("h100-sxm"), wl, Slo(ttft_s=ttft_s, tpot_s=tpot_s),
                       None, SearchSpace(tp_prefill=[1], tp_decode=[1], max_gpus=max_gpus))


@pytest.fixture(scope="module")
def colocated_plan():
    # 64-token prompts: a prefill instance of its own idles; four colocated GPUs all decode
    return make_plan(_problem(64, 512, 0.5, 0.03), FAST)


def test_short_prompts_long_outputs_colocated_must_win(colocated_plan):
    plan = colocated_plan
    c = plan.comparison
    assert c is not None and c.recommended == "colocated" and c.ratio_per_gpu > 1.3
    assert plan.colocated is not None and plan.colocated.num_instances == 4
    assert c.colocated.static_rate_per_s > 0 and c.colocated.ttft_s["p90"] <= 0.5


def test_long_prompts_tight_tpot_disaggregated_must_win(tmp_path):
    # 8k-token prompts at TPOT 10 ms: chunks inflate every colocated decode step
    plan = make_plan(_problem(8192, 128, 2.0, 0.010), FAST)
    c = plan.comparison
    assert c is not None and c.recommended == "disaggregated" and c.ratio_per_gpu > 1.2
    assert c.disaggregated.goodput_per_gpu_per_s > c.colocated.goodput_per_gpu_per_s
    path = tmp_path / "plan.yaml"
    plan.save(path)
    assert load_plan(path).comparison == c


@pytest.mark.parametrize("path", sorted(Path("configs/plans").glob("*.yaml")), ids=lambda p: p.name)
def test_bundled_plan_files_still_load(path):
    assert load_plan(path).model


def test_simulate_takes_the_plans_colocated_configuration(colocated_plan):
    from trtpd.sim.cluster_specs import options_from_plan
    opts = options_from_plan(colocated_plan)
    c = colocated_plan.colocated
    assert (opts.colocated_policy, opts.colocated_tp, opts.num_colocated_instances) == (c.policy, c.tp, c.num_instances)
    assert opts.colocated_max_num_tokens == c.max_num_tokens


@pytest.mark.parametrize("path", sorted(Path("configs/plans").glob("*.yaml")), ids=lambda p: p.name)
def test_bundled_plan_files_fit_their_models_context(path):
    plan = load_plan(path)
    context = get_model(plan.model).max_position_embeddings
    lengths = [plan.prefill.max_seq_len, plan.decode.max_seq_len] if plan.decode else [plan.colocated.max_seq_len]
    assert max(lengths) <= context, f"{path.name}: max_seq_len {max(lengths)} > {plan.model}'s {context}"
    assert not any("context" in note for note in plan.notes), plan.notes


@pytest.mark.parametrize("path", sorted(Path("configs/plans").glob("*.yaml")), ids=lambda p: p.name)
def test_the_side_by_side_table_keeps_its_columns_apart(path):
    from trtpd.planner.report import comparison_lines
    plan = load_plan(path)
    if plan.comparison is None:
        pytest.fail(f"{path.name} has no colocated comparison: regenerate it with trtpd plan")
    lines = comparison_lines(plan)
    rows = lines[1:next(i for i, line in enumerate(lines) if line.startswith("  recommendation"))]
    assert len(rows) == 10
    start = rows[0].index("colocated")            # the header row: where the right column begins
    for row in rows[1:]:
        assert row[start - 2:start] == "  " and row[start] != " ", "\n".join(rows)


def test_a_probe_does_not_pass_a_rate_its_steady_state_fails(chat_problem):
    """The requests that arrive in a run's last span (the longest output x TPOT) live on into the drain after
    the last arrival, when nothing new competes: measured, they flatter a short run. 12 colocated TP2
    instances at 240 requests/s (chat): a 6,000-request run measured after its warm-up only passes (99%),
    the same rate run on fails (every 10 s window after the first); a probe excludes that cool-down, and fails."""
    import numpy as np

    from trtpd.planner.compare import Goodput, shortlist
    from trtpd.planner.search import Planner
    from trtpd.sim.metrics import summarize
    from trtpd.sim.simulator import Simulator, default_max_in_system
    from trtpd.sim.workload import generate_requests
    problem = chat_problem(200.0)
    planner = Planner(problem)
    candidate = max(shortlist(planner), key=lambda x: x[1] / x[0].tp)[0]
    cluster = candidate.cluster(12, problem.space.tokens_per_block)
    slo, goodput = problem.slo, Goodput(problem, 1000, 0)

    def run(num_requests):
        requests = generate_requests(problem.workload, 240.0, num_requests, 0)
        return Simulator(cluster, requests, max_in_system=default_max_in_system(cluster)).run()
    short = summarize(run(6000), slo.ttft_s, slo.tpot_s, warmup_s=goodput.warmup_s)
    assert short.slo_attainment >= slo.attainment                      # the trap is real
    steady = run(24000)
    arrival = np.asarray(steady.records.arrival_s)
    late = summarize(steady, slo.ttft_s, slo.tpot_s, warmup_s=goodput.warmup_s, cooldown_s=arrival[-1] - 60.0)
    assert late.slo_attainment < 0.5 * slo.attainment                  # 19-60 s: far below the target
    passed, summary, _ = goodput.run_at(cluster, 240.0)
    assert not passed and summary.slo_attainment < slo.attainment
