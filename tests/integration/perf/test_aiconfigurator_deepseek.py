"""DeepSeek-V3 (MLA + MoE) curves from AIConfigurator's real database (aiconfigurator-core 0.12.0 in .venv-aic;
no skip: `TRTPD_SETUP_AIC=1 scripts/setup.sh`) against AIConfigurator's own per-operator estimate for
DeepSeek-V3 on h200_sxm at TP8 (attention TP8, routed experts EP8), fp8 block-scaled GEMMs and experts,
fp8 KV (its Python API, static_ctx / static_gen modes)."""

import json

import pytest

from tests.integration.perf.conftest import run_oracle

from trtpd.catalog import get_model
from trtpd.errors import ConfigError
from trtpd.perf.aiconfigurator import (AicSystem, composer_for, database_root, export_database,
                                       profile_from_aiconfigurator)

SYSTEM = "h200_sxm"
CASES = {"context_b1_isl2048": ("static_ctx", 1, 2048, 1), "context_b4_isl1024": ("static_ctx", 4, 1024, 1),
         "decode_b32_ctx1024": ("static_gen", 32, 1023, 2), "decode_b128_ctx4096": ("static_gen", 128, 4095, 2)}

ORACLE = r'''
import json, logging, sys, warnings
logging.disable(logging.WARNING)
warnings.filterwarnings("ignore")
from aiconfigurator.cli.api import cli_estimate
out = {}
for name, (mode, bs, isl, osl) in json.loads(sys.argv[1]).items():
    r = cli_estimate("deepseek-ai/DeepSeek-V3", "h200_sxm", mode=mode, batch_size=bs, isl=isl, osl=osl,
                     tp_size=8, moe_tp_size=1, moe_ep_size=8)
    ops = r.summary.get_generation_latency_dict() if mode == "static_gen" else r.summary.get_context_latency_dict()
    out[name] = {"ops": dict(ops), "quant": [r.raw["gemm"], r.raw["moe"], r.raw["kvcache"]],
                 "version": r.backend_version}
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def aic(venv_python):
    return run_oracle(venv_python, ORACLE, json.dumps(CASES))


@pytest.fixture(scope="module")
def system(venv_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("aic-csv")
    export_database(SYSTEM, out, venv_python, ops=("gemm", "comm", "mla", "moe"))
    return AicSystem(database_root(out), SYSTEM)


def _case(name):
    kind, b, n = name.split("_")
    return kind, int(b[1:]), int(n.lstrip("ctxisl"))


@pytest.mark.parametrize("case", list(CASES))
def test_each_measured_operator_is_aiconfigurators_per_layer(system, aic, case):
    """AIC counts all 61 layers as MoE layers; per layer, every measured operator must agree."""
    est = aic[case]
    assert est["quant"] == ["fp8_block", "fp8_block", "fp8"]
    kind, batch, length = _case(case)
    c = composer_for(system, get_model("deepseek-v3"), 8, "fp8", "fp8")
    phase = "context" if kind == "context" else "generation"
    layer = c.layer_ops_ms(phase, batch * length if kind == "context" else batch, batch, length)
    theirs = {k: v / 61 for k, v in est["ops"].items()}
    p = phase + "_"
    assert layer["mla_module"] == pytest.approx(theirs[p + "mla_block"], rel=0.01)
    if kind == "context":
        assert layer["all_reduce"] == pytest.approx(theirs[p + "moe_pre_dispatch"] + theirs[p + "moe_post_dispatch"],
                                                    rel=0.01)
        shared = theirs[p + "shared_gate_up_gemm"] + theirs[p + "shared_ffn2_gemm"]
        assert layer["shared_gemms"] == pytest.approx(shared, rel=0.01)
        assert layer["router_gemm"] == pytest.approx(theirs[p + "router_gemm"], rel=0.01)
        assert layer["moe"] == pytest.approx(theirs[p + "moe"], rel=0.01)
    else:   # shared experts overlap the router, the all-reduces and the routed experts
        routed = layer["router_gemm"] + layer["all_reduce"] + layer["moe"]
        assert max(routed, layer["shared_gemms"]) == pytest.approx(theirs[p + "moe_overlap"], rel=0.01)
    ops = c.context_ops_ms(batch, length) if kind == "context" else c.decode_ops_ms(batch, length)
    assert ops["logits_gemm"] == pytest.approx(est["ops"][p + "logits_gemm"], rel=0.01)
    assert system.versions["mla"] == system.versions["moe"] == est["version"]


def test_a_decode_step_is_aics_measured_operators_with_deepseeks_three_dense_layers(system, aic):
    """trtpd's step = AIC's measured operators (mla block, MoE overlap, LM head) with the first 3 layers
    dense, as DeepSeek-V3 is (first_k_dense_replace = 3): their MoE part swapped for two all-reduces and the
    dense MLP (intermediate 18,432 / 8)."""
    m = get_model("deepseek-v3")
    ops = aic["decode_b32_ctx1024"]["ops"]
    c = composer_for(system, m, 8, "fp8", "fp8")
    layer = c.layer_ops_ms("generation", 32, 32, 1024)
    moe_layer = ops["generation_moe_overlap"] / 61
    expected = (ops["generation_mla_block"] + 58 * moe_layer + 3 * (layer["all_reduce"] + layer["dense_mlp_gemms"])
                + ops["generation_logits_gemm"])
    assert m.first_k_dense_layers == 3 and m.num_moe_layers == 58
    assert c.decode_step_s(32, 1024) * 1e3 == pytest.approx(expected, rel=0.01)
    dense_mlp = system.gemm_ms(32, 2 * 18432 // 8, 7168, "fp8_block") + system.gemm_ms(32, 7168, 18432 // 8,
                                                                                       "fp8_block")
    assert layer["dense_mlp_gemms"] == pytest.approx(dense_mlp)


def test_the_deepseek_v31_profile_feeds_the_planner_and_names_its_source(system):
    from trtpd.perf.hardware import load_hardware
    from trtpd.perf.model import instance_perf
    m = get_model("deepseek-v3.1")                       # seed 004's model: V3's shapes, V3's module rows
    measured = profile_from_aiconfigurator(system, m, 8, "fp8", "fp8")
    hw = load_hardware("h200").model_copy(update={"measured": [measured]})
    inst = instance_perf(m, hw, 8, "fp8", "fp8")
    assert inst.source.startswith("measured: aiconfigurator h200_sxm trtllm (gemm 1.3.0rc20, mla 1.3.0rc20, moe")
    assert "EP8" in inst.source
    v3 = composer_for(system, get_model("deepseek-v3"), 8, "fp8", "fp8")
    assert inst.perf.decode_step_s(64, 64 * 4096) == pytest.approx(v3.decode_step_s(64, 4096), rel=1e-9)
    steps = measured.prefill.latency_s
    assert all(b > a for a, b in zip(steps, steps[1:]))
    grid = measured.decode.step_latency_s
    assert all(row[-1] > row[0] for row in grid)          # longer context, longer step


def test_a_model_without_measured_mla_modules_is_refused_with_a_reason(system):
    import dataclasses
    other = dataclasses.replace(get_model("deepseek-v3"), name="kimi-like", hf_id="moonshotai/Kimi-K2",
                                num_heads=64, num_kv_heads=64)
    with pytest.raises(ConfigError, match="measured .*DeepSeek-V3.*not .*Kimi-K2"):
        composer_for(system, other, 8, "fp8", "fp8").decode_step_s(8, 1024)
