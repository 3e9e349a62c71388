import re

from trtpd.cli.main import main
from trtpd.schema.plan import load_plan


def test_seed004_cli_reproduces_the_worked_example(capsys):
    assert main(["plan", "--method", "seed004", "--tokens-per-min", "5e6", "--tp-prefill-tokens-per-s", "25000"]) == 0
    out = capsys.readouterr().out
    assert "= 25066.3 tokens/s" in out
    assert "N_prefill = 3.08 -> 4" in out and "4P4D" in out
    assert "3P4D, which sustains only 4.875M tokens/min" in out
    assert main(["plan", "--method", "seed004", "--tokens-per-min", "4.8e6", "--tp-prefill-tokens-per-s", "25000"]) == 0
    assert ": 3P4D" in capsys.readouterr().out


def test_plan_cli_writes_a_plan_and_simulate_reads_it(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    rc = main(["plan", "--workload", "chat-powerlaw", "--slo", "chat", "--rate-per-s", "20",
               "--verify-requests", "1000", "-o", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert re.search(r"simulated \(\d+ requests\)", text) and "(pass)" in text
    plan = load_plan(out)
    assert plan.feasible
    assert main(["simulate", "--plan", str(out), "--num-requests", "800", "--mode", "both"]) == 0
    text = capsys.readouterr().out
    assert "disaggregated" in text and "colocated" in text and "attainment" in text


def test_infeasible_plan_exits_3_and_names_the_constraint(capsys):
    rc = main(["plan", "--rate-per-s", "5", "--tpot-s", "0.001", "--no-verify"])
    assert rc == 3
    assert "binding constraint tpot" in capsys.readouterr().out


def test_bad_input_is_a_clear_error_without_traceback(capsys):
    assert main(["plan", "--rate-per-s", "5", "--hardware", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown hardware 'nope'" in err and "Traceback" not in err
    assert main(["simulate", "--workload", "chat-powerlaw"]) == 2
    assert "--rate-per-s" in capsys.readouterr().err


def test_a_cpu_profile_is_planned_and_simulated_in_its_own_dtype_and_names_its_curves(capsys):
    """cpu-reference has only an fp32 figure: plan's fp8 default rejected every TP there ("no usable TP") and
    simulate's fp16 default stopped with an error; without --weight-dtype both now use the profile's own."""
    rc = main(["plan", "--model", "tiny-llama", "--hardware", "cpu-reference", "--max-gpus", "2", "--no-verify"])
    text = capsys.readouterr().out
    assert rc == 0 and "sustains up to" in text and "no usable TP" not in text
    assert "curves: cpu-reference's curves for tiny-llama were measured on" in text
    assert main(["simulate", "--model", "tiny-llama", "--hardware", "cpu-reference", "--num-prefill", "1",
                 "--num-decode", "1", "--rate-per-s", "2", "--num-requests", "50", "--mode", "disaggregated"]) == 0
    assert "attainment" in capsys.readouterr().out
    assert main(["plan", "--model", "tiny-llama", "--hardware", "cpu-reference", "--max-gpus", "2", "--no-verify",
                 "--weight-dtype", "fp8"]) == 3   # asked for by name: still refused


def test_a_plan_on_measured_curves_uses_their_kv_dtype_and_one_at_another_says_it_is_the_roofline(capsys):
    """cpu-reference's curves are fp16 KV: plan's fp8 default planned on the roofline and still said the curves
    were measured on a machine (`(roofline)` on the role lines above `curves: ... measured on`)."""
    assert main(["plan", "--model", "tiny-llama", "--hardware", "cpu-reference", "--max-gpus", "2", "--no-verify",
                 "--no-colocated"]) == 0
    text = capsys.readouterr().out
    assert "fp16 KV" in text and "max_input_len 4096 (measured)" in text and "roofline" not in text
    assert "curves: cpu-reference's curves for tiny-llama were measured on" in text
    assert main(["plan", "--model", "tiny-llama", "--hardware", "cpu-reference", "--max-gpus", "2", "--no-verify",
                 "--no-colocated", "--kv-dtype", "fp8"]) == 0
    text = capsys.readouterr().out
    assert "max_input_len 4096 (roofline)" in text
    assert ("curves: roofline estimate (cpu-reference has curves for tiny-llama at fp16 KV only, not fp8: "
            "--kv-dtype fp16 uses them)") in text


def test_a_plan_whose_simulation_failed_does_not_claim_to_sustain_0_requests_per_s(tmp_path, capsys):
    """The planner calibrates its analytic model to the simulation at the target; where the simulation failed with
    a queue that grows without bound, the calibrated model finds no rate at all, and the report said "sustains up
    to 0 requests/s: goodput 0" above a comparison that simulated the same configuration at 2.7 requests/s."""
    from trtpd.planner.report import plan_text
    from trtpd.schema.plan import Verification, load_plan

    out = tmp_path / "plan.yaml"
    assert main(["plan", "--model", "tiny-llama", "--hardware", "cpu-reference", "--max-gpus", "2", "--no-verify",
                 "--kv-dtype", "fp16", "--output", str(out)]) == 0
    capsys.readouterr()
    plan = load_plan(out)
    assert plan.max_rate_per_s > 0 and "sustains up to" in plan_text(plan)
    failed = Verification(num_requests=100, rate_per_s=2.95, ttft_s={"p50": 1.2, "p90": 10.0, "p99": 15.8},
                          tpot_s={"p50": 0.039, "p90": 0.044, "p99": 0.048}, slo_attainment=0.402, passed=False,
                          ttft_breakdown_s={}, simulations=[])
    text = plan_text(plan.model_copy(update={"verification": failed, "max_rate_per_s": 0.0}))
    assert "sustains up to" not in text
    assert "no rate confirmed (the simulator's check at 2.95 requests/s failed: 40.2% of requests met" in text
