"""On a CPU profile measured with --serving, the planner's candidates carry the serving path of their mode (the
response latency, the step costs and the shared cores), as `trtpd simulate` does; on GPUs there is none."""

from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.planner.compare import candidate_key, candidate_of, shortlist
from trtpd.planner.inputs import SearchSpace, Target
from trtpd.planner.role_models import KvLinkModel
from trtpd.planner.search import PlanProblem, Planner
from trtpd.planner.verify import cluster_for
from trtpd.schema.slo import load_slo
from trtpd.sim.workload import load_workload


def _planner(hardware: str, model: str, kv_dtype: str) -> Planner:
    return Planner(PlanProblem(get_model(model), load_hardware(hardware), load_workload("cpu-powerlaw-long"),
                               load_slo("chat"), Target(rate_per_s=2.0),
                               SearchSpace(max_gpus=2, kv_dtype=kv_dtype, weight_dtype="fp32")))


def test_each_side_carries_its_own_measured_serving_path():
    hardware = load_hardware("cpu-reference")
    serving = hardware.find_measured("tiny-llama", 1, "fp16").serving
    planner = _planner("cpu-reference", "tiny-llama", "fp16")
    prefill, decode = planner.prefills[0], planner.decodes[0]
    link = KvLinkModel(1e10, 5e-5, decode.inst.kv_bytes_per_token, planner.stats)
    cluster = cluster_for(prefill, decode, 1, 1, link, planner.problem.space.tokens_per_block, "decode")
    d = serving["disaggregated"]
    assert cluster.shared_cores is not None and cluster.shared_cores.cores == d.host_cores
    assert cluster.shared_cores.serving_cpu_per_token_s == d.serving_cpu_per_token_s
    assert cluster.response_latency_s == d.response_latency_s
    colocated = candidate_of(planner, candidate_key(shortlist(planner)[0][0]))
    c = serving["colocated"]
    assert colocated.inst.response_latency_s == c.response_latency_s
    assert colocated.inst.shared_cores.serving_cpu_per_token_s == c.serving_cpu_per_token_s


def test_gpu_profiles_have_no_serving_path():
    planner = _planner("h100-sxm", "llama-2-70b", "fp8")
    assert all(d.inst.shared_cores is None and d.inst.response_latency_s == 0 for d in planner.decodes)
