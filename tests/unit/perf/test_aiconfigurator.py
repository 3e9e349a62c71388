"""The AIConfigurator source against values read from its database.

tests/unit/perf/data/aic/ is an extract of aiconfigurator-core 0.12.0's H100 SXM TensorRT-LLM 1.3.0rc20
tables (the rows for Llama-3.1-8B TP1 and Llama-3.1-70B TP2 shapes, fp8 GEMMs and KV, the bf16 GEMMs of the
collected shapes nearest their LM heads, and every all-reduce row), converted from parquet to CSV with
pyarrow; the source reads either.
"""

import csv
from pathlib import Path

import pytest

from trtpd.catalog import get_model
from trtpd.errors import ConfigError
from trtpd.perf.aiconfigurator import (AicComposer, AicSystem, database_root, interp,
                                       profile_from_aiconfigurator)
from trtpd.perf.hardware import load_hardware
from trtpd.perf.model import instance_perf

DB = Path(__file__).parent / "data" / "aic"
TABLES = DB / "h100_sxm"


def _rows(rel):
    with (TABLES / rel).open() as f:
        return list(csv.DictReader(f))


@pytest.fixture()
def system():
    return AicSystem(database_root(DB), "h100_sxm")


def test_gemm_at_a_measured_point_is_the_database_value(system):
    row = next(r for r in _rows("gemm/trtllm/1.3.0rc20/gemm_perf.csv")
               if (r["gemm_dtype"], r["m"], r["n"], r["k"]) == ("fp8", "8192", "4096", "4096"))
    assert system.gemm_ms(8192, 4096, 4096, "fp8") == pytest.approx(float(row["latency"]))
    assert system.gemm_ms(8192, 4096, 4096, "fp8") == pytest.approx(0.282005, rel=1e-5)
    # between measured m: linear; a shape not in the table scales from the nearest one by n x k
    lo, hi = system.gemm_ms(8192, 4096, 4096, "fp8"), system.gemm_ms(16384, 4096, 4096, "fp8")
    assert system.gemm_ms(12288, 4096, 4096, "fp8") == pytest.approx((lo + hi) / 2)
    assert system.gemm_ms(8192, 4096, 4608, "fp8") == pytest.approx(lo * 4608 / 4096)
    assert system.versions["gemm"] == "1.3.0rc20"


def test_attention_and_allreduce_at_measured_points(system):
    row = next(r for r in _rows("attention/trtllm/1.3.0rc20/generation_attention_perf.csv")
               if (r["num_heads"], r["num_key_value_heads"], r["batch_size"], r["step"]) == ("32", "8", "64", "1023"))
    context = float(row["isl"]) + float(row["step"])
    assert system.attention_ms("generation_attention_perf", 64, context, (32, 8, 128), "fp8") == \
        pytest.approx(float(row["latency"]))
    ar = next(r for r in _rows("comm/trtllm/1.3.0rc20/custom_allreduce_perf.csv")
              if (r["num_gpus"], r["message_size"]) == ("4", "128"))
    assert system.allreduce_ms(4, 128) == pytest.approx(float(ar["latency"])) == pytest.approx(0.0027958, rel=1e-4)
    assert system.allreduce_ms(1, 1e6) == 0.0


def test_a_decode_step_is_the_sum_of_its_operators(system):
    m = get_model("llama-3.1-8b")
    c = AicComposer(system, m, 1, "fp8", "fp8")
    gemms = sum(system.gemm_ms(32, n, k, "fp8") for n, k in c.shapes.gemms())
    attn = system.attention_ms("generation_attention_perf", 32, 1024, (32, 8, 128), "fp8")
    head = system.gemm_ms(32, m.vocab_size, m.hidden_size, "bfloat16")     # the LM head is not quantized
    assert c.decode_step_s(32, 1024) == pytest.approx((m.num_layers * (gemms + attn) + head) / 1e3)
    assert c.shapes.gemms() == [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


def test_the_profile_feeds_the_planner_and_names_its_source(system):
    measured = profile_from_aiconfigurator(system, get_model("llama-3.1-8b"), 1, "fp8", "fp8")
    hw = load_hardware("h100-sxm").model_copy(update={"measured": [measured]})
    inst = instance_perf(get_model("llama-3.1-8b"), hw, 1, "fp8", "fp8")
    assert inst.source.startswith("measured: aiconfigurator h100_sxm trtllm (gemm 1.3.0rc20")
    assert inst.perf.decode_step_s(1, 1024) == pytest.approx(
        AicComposer(system, get_model("llama-3.1-8b"), 1, "fp8", "fp8").decode_step_s(1, 1024), rel=1e-6)
    steps = measured.prefill.latency_s
    assert all(b >= a for a, b in zip(steps, steps[1:]))      # more tokens never take less time


def test_profile_cli_writes_a_hardware_profile(tmp_path, capsys):
    from trtpd.cli.main import main
    out = tmp_path / "h100-aic.yaml"
    assert main(["profile", "--from", "aiconfigurator", "--model", "llama-3.1-70b", "--tp", "2", "--system",
                 "h100_sxm", "--aic-db", str(DB), "--output", str(out)]) == 0
    hw = load_hardware(str(out))
    assert hw.name == "h100-sxm" and hw.find_measured("llama-3.1-70b", 2, "fp8") is not None
    assert "aiconfigurator h100_sxm" in capsys.readouterr().out


def test_moe_models_are_refused_with_a_reason(system):
    with pytest.raises(ConfigError, match="dense GQA/MHA models only"):
        AicComposer(system, get_model("deepseek-v3"), 8, "fp8", "fp8")


def test_interp_extends_linearly_and_never_goes_negative():
    assert interp([1.0, 2.0], [1.0, 2.0], 4.0) == pytest.approx(4.0)
    assert interp([1.0, 2.0], [1.0, 3.0], -5.0) == 0.0
    assert interp([3.0], [7.0], 100.0) == 7.0


def test_a_colocated_step_reads_the_weights_once(system):
    from trtpd.perf.measured import MeasuredPerfModel
    perf = MeasuredPerfModel(profile_from_aiconfigurator(system, get_model("llama-3.1-8b"), 1, "fp8", "fp8"))
    mixed = perf.mixed_step_s(512, 512 * 512, 32, 32 * 1024)
    assert mixed < perf.prefill_s(512) + perf.decode_step_s(32, 32 * 1024)
    assert mixed > max(perf.prefill_s(512), perf.decode_step_s(32, 32 * 1024))
