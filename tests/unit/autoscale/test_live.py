"""The live adapter's observation: decode judged by TPOT, every latency at the SLO's percentile, measured as the
simulator measures it (the same requests give the same TTFT and TPOT live and in simulation)."""

from __future__ import annotations

import pytest

from trtpd.autoscale.core import FleetObservation
from trtpd.autoscale.live import observe
from trtpd.controller.types import InstanceRow
from trtpd.percentiles import quantile
from trtpd.schema.request_sample import RequestSample
from trtpd.schema.slo import Slo
from trtpd.sim.records import RequestRecords
from trtpd.sim.scaling import window_latencies
from trtpd.sim.workload import RequestArrays

NOW_S, WINDOW_S = 100.0, 30.0
# ten requests that arrived and finished inside the window: (arrival, first token, done, output tokens)
REQUESTS = [(80.0 + i, 80.0 + i + 0.1 * (i + 1), 80.0 + i + 0.1 * (i + 1) + 0.01 * (i + 1) * 9, 10)
            for i in range(10)]
TABLE = [InstanceRow("prefill-0", "prefill", 1, "ready", 0.0), InstanceRow("decode-0", "decode", 1, "ready", 0.0),
         InstanceRow("decode-1", "decode", 1, "draining", 0.0)]


def samples() -> list[RequestSample]:
    """As the gateway keeps them; a single gap (itl_p90_s) far over any SLO."""
    return [RequestSample(t=done, revision=1, ok=True, error_kind=None, ttft_s=first - arrival,
                          tpot_s=(done - first) / (out - 1), num_tokens=out, num_prompt_tokens=100,
                          prefill_queue_s=0.01 * i, decode_queue_s=0.0, itl_p90_s=9.9)
            for i, (arrival, first, done, out) in enumerate(REQUESTS)]


@pytest.mark.parametrize("attainment", [0.5, 0.9, 0.99])
def test_decode_is_judged_by_tpot_at_the_slos_percentile(attainment):
    obs = observe(NOW_S, WINDOW_S, samples(), None, TABLE, Slo(ttft_s=2.0, tpot_s=0.1, attainment=attainment))
    tpots = [s.tpot_s for s in samples()]
    assert obs.roles["decode"].tpot_p_s == pytest.approx(quantile(tpots, attainment))
    assert obs.roles["decode"].tpot_p_s < 0.11          # the 9.9 s single gap is not what decode is judged by
    assert obs.roles["prefill"].ttft_p_s == pytest.approx(quantile([s.ttft_s for s in samples()], attainment))
    assert obs.roles["prefill"].queue_time_p_s == pytest.approx(quantile([0.01 * i for i in range(10)], attainment))
    assert (obs.roles["decode"].num_instances, obs.roles["decode"].num_draining) == (1, 1)
    assert obs.slo.attainment == attainment


def test_live_and_simulated_measure_the_same_requests_alike():
    arrays = RequestArrays([r[0] for r in REQUESTS], [100] * 10, [r[3] for r in REQUESTS])
    records = RequestRecords(arrays)
    for i, (_, first, done, _) in enumerate(REQUESTS):
        records.first_token_s[i], records.done_s[i] = first, done
    slo = Slo(ttft_s=2.0, tpot_s=0.1, attainment=0.9)
    simulated = window_latencies(records, NOW_S, WINDOW_S, q=slo.attainment)
    live = observe(NOW_S, WINDOW_S, samples(), None, TABLE, slo)
    assert live.roles["prefill"].ttft_p_s == pytest.approx(simulated.ttft_p_s, rel=1e-12)
    assert live.roles["decode"].tpot_p_s == pytest.approx(simulated.tpot_p_s, rel=1e-12)


# ---- the model the live autoscaler acts on (issue: it always modelled cpu-reference) -----------------------------
def _gpu_spec(tmp_path, extra: dict | None = None):
    """llama-2-70b as trtllm-serve pods on Kubernetes (instances on GPUs), prefill TP2 and decode TP4, engines as a
    finished build leaves them, autoscaling on. (Backend tensorrt-llm has no autoscaler: new counts are a new
    world.)"""
    import yaml
    from tests.unit.controller.test_k8s_spec import finished_engines
    from trtpd.controller.spec import load_spec

    mount = tmp_path / "engines"
    finished_engines(mount)
    spec = {"name": "llama", "model": "llama-2-70b", "backend": "trtllm-serve",
            "engines": {"build_root": str(mount / "llama-2-70b")},
            "kubernetes": {"api_server": "https://10.0.0.1:6443", "gateway_image": "registry.example/trtpd:1",
                           "engines": {"mount_path": str(mount), "pvc_name": "engines"}},
            "roles": {"prefill": {"instances": 1, "tp": 2}, "decode": {"instances": 2, "tp": 4}},
            "autoscaling": {"enabled": True, "max": {"prefill": 4, "decode": 4}, **(extra or {})}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_spec(path)


def test_a_gpu_deployment_is_modelled_on_its_hardware_at_each_roles_tp(tmp_path):
    """The live autoscaler models the spec's model at the engines' TP and dtypes on the named profile, and counts
    GPUs: a TP4 decode instance costs 4 of the budget."""
    from trtpd.autoscale.live import live_autoscaler, performance_model
    spec = _gpu_spec(tmp_path, {"hardware": "h100-sxm"})
    hardware, options, source = performance_model(spec)
    assert hardware.name == "h100-sxm" and (options.tp_prefill, options.tp_decode) == (2, 4)
    assert options.weight_dtype == "fp8" and options.kv_dtype == "fp8" and source == "the engines' manifests"
    autoscaler = live_autoscaler(spec)
    assert autoscaler.policy.cost_per_instance == {"prefill": 2, "decode": 4}
    assert autoscaler.policy.budget == 4 * 2 + 4 * 4
    h200 = live_autoscaler(_gpu_spec(tmp_path / "h200", {"hardware": "h200"}))
    probe = FleetObservation(0.0, 1.0, 2000.0, 200.0, {}, Slo(ttft_s=2.0, tpot_s=0.05))
    assert h200.rate_per_instance("decode", probe) > autoscaler.rate_per_instance("decode", probe)   # more HBM/s


def test_a_gpu_deployment_without_a_profile_or_plan_is_refused_naming_the_field(tmp_path):
    from trtpd.controller.spec import check_revision
    problems = check_revision(_gpu_spec(tmp_path), revision=1)
    assert len(problems) == 1 and "autoscaling.hardware: the trtllm-serve instances run on GPUs" in problems[0]
    assert "h100-sxm" in problems[0]
    problems = check_revision(_gpu_spec(tmp_path / "typo", {"hardware": "h100-sxmm"}), revision=1)
    assert len(problems) == 1 and "autoscaling.hardware: no hardware profile 'h100-sxmm'" in problems[0]
    problems = check_revision(_gpu_spec(tmp_path / "a100", {"hardware": "a100-80g"}), revision=1)
    assert problems == ["revision 1: hardware 'a100-80g' has no FP8 support; use fp16 weights and KV"]   # fp8 engines
    assert check_revision(_gpu_spec(tmp_path / "named", {"hardware": "h200"}), revision=1) == []


def test_cpu_instances_are_modelled_on_cpu_reference_and_cost_cores(tmp_path, fp16_root):
    """The reference backend and trtllm-serve's CPU twin: the reference engines on cpu-reference (or the profile
    named, e.g. one `trtpd profile` measured here), costs in cores, not in the GPUs they do not have."""
    from tests.unit.controller.test_spec import BASE, write
    from trtpd.autoscale.live import live_policy, performance_model
    from trtpd.controller.spec import load_spec
    text = BASE.format(root=fp16_root).replace("    cpus_per_instance: 1\n", "    cpus_per_instance: 2\n")
    for backend in ("reference", "trtllm-serve"):
        spec = load_spec(write(tmp_path, text + f"backend: {backend}\nautoscaling: {{enabled: true}}\n"))
        hardware, options, _ = performance_model(spec)
        assert hardware.name == "cpu-reference" and options.weight_dtype == "fp32"
        assert live_policy(spec).cost_per_instance == {"prefill": 1, "decode": 2}
    named = load_spec(write(tmp_path, text + "autoscaling: {enabled: true, hardware: h100-sxm}\n"))
    assert performance_model(named)[0].name == "h100-sxm"
