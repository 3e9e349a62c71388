"""The AIConfigurator source against the real installed database: aiconfigurator-core 0.12.0 in .venv-aic
(`TRTPD_SETUP_AIC=1 scripts/setup.sh`; scripts/test.sh sets it). No skip: without .venv-aic these fail.

The oracle runs in .venv-aic: rows read from the parquet tables with pyarrow, and AIConfigurator's own
per-operator estimates (its Python API, static_gen / static_ctx modes) for Llama-3.1-70B TP2 with fp8 GEMMs
and fp8 KV on h100_sxm. trtpd reads the same tables exported to CSV (trtpd/perf/aic_export.py, also in
.venv-aic: trtpd's .venv has no pyarrow).
"""

import csv
import json
import math

import pytest

from tests.integration.perf.conftest import run_oracle

from trtpd.catalog import get_model
from trtpd.errors import ConfigError
from trtpd.perf.aiconfigurator import AicComposer, AicSystem, aic_python, database_root, export_database

SYSTEM = "h100_sxm"

ORACLE = r'''
import json, logging, random, sys, warnings
from pathlib import Path
logging.disable(logging.WARNING)
warnings.filterwarnings("ignore")
import aiconfigurator_core
import pyarrow.parquet as pq
from aiconfigurator.cli.api import cli_estimate

system = sys.argv[1]
root = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / system
rng = random.Random(0)
out = {"row_counts": {}, "allreduce": {}}

def unique(rows, key):
    seen = {}
    for r in rows:
        seen.setdefault(key(r), []).append(r)
    return [v[0] for v in seen.values() if len(v) == 1]

for op, table in (("gemm", "gemm_perf"), ("attention", "context_attention_perf"),
                  ("attention", "generation_attention_perf"), ("comm", "custom_allreduce_perf")):
    for f in sorted((root / op / "trtllm").glob(f"*/{table}.parquet")):
        out["row_counts"][str(f.relative_to(root.parent).with_suffix(".csv"))] = pq.read_metadata(f).num_rows

gemm = pq.read_table(root / "gemm/trtllm/1.3.0rc20/gemm_perf.parquet").to_pylist()
gemm = unique([r for r in gemm if r["gemm_dtype"] in ("bfloat16", "fp8")],
              lambda r: (r["gemm_dtype"], r["m"], r["n"], r["k"]))
out["gemm"] = rng.sample(gemm, 40)
for table in ("context_attention_perf", "generation_attention_perf"):
    rows = pq.read_table(root / f"attention/trtllm/1.3.0rc20/{table}.parquet").to_pylist()
    rows = [r for r in rows if r["window_size"] == 0 and r["attn_dtype"] == "bfloat16"]
    rows = unique(rows, lambda r: (r["num_heads"], r["num_key_value_heads"], r["head_dim"], r["kv_cache_dtype"],
                                   r["batch_size"], r["isl"] + r["step"]))
    out[table] = rng.sample(rows, 25)
for f in sorted((root / "comm/trtllm").glob("*/custom_allreduce_perf.parquet")):
    out["allreduce"][f.parent.name] = [r for r in pq.read_table(f).to_pylist() if r["allreduce_dtype"] == "bfloat16"]

kw = dict(tp_size=2, gemm_quant_mode="fp8", kvcache_quant_mode="fp8")
model = "meta-llama/Meta-Llama-3.1-70B"
est = {}
for name, mode, bs, isl, osl in (("decode_b32_ctx1024", "static_gen", 32, 1023, 2),
                                 ("decode_b128_ctx4096", "static_gen", 128, 4095, 2),
                                 ("context_b1_isl2048", "static_ctx", 1, 2048, 1),
                                 ("context_b4_isl1024", "static_ctx", 4, 1024, 1)):
    r = cli_estimate(model, system, mode=mode, batch_size=bs, isl=isl, osl=osl, **kw)
    ops = r.summary.get_generation_latency_dict() if mode == "static_gen" else r.summary.get_context_latency_dict()
    est[name] = {"ops": dict(ops), "version": r.backend_version,
                 "quant": [r.raw["gemm"], r.raw["kvcache"], r.raw["fmha"]]}
out["estimates"] = est
print(json.dumps(out, default=str))
'''


@pytest.fixture(scope="module")
def aic(venv_python):
    return run_oracle(venv_python, ORACLE, SYSTEM)


@pytest.fixture(scope="module")
def exported(venv_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("aic-csv")
    return out, export_database(SYSTEM, out, venv_python, ops=("gemm", "attention", "comm"))


@pytest.fixture(scope="module")
def system(exported):
    return AicSystem(database_root(exported[0]), SYSTEM)


def test_a_missing_aic_environment_says_how_to_make_it(tmp_path):
    with pytest.raises(ConfigError, match=r"TRTPD_SETUP_AIC=1 scripts/setup\.sh"):
        aic_python(tmp_path / "no-venv")


def test_the_export_keeps_every_row_of_every_version(exported, aic):
    out, report = exported
    assert report["tables"] == aic["row_counts"]
    assert any("gemm_perf" in k for k in aic["row_counts"]) and len(aic["row_counts"]) >= 4
    for rel, count in aic["row_counts"].items():
        with (out / rel).open() as f:
            assert sum(1 for _ in csv.DictReader(f)) == count, rel


def test_gemms_at_measured_points_are_the_parquet_values(system, aic):
    for r in aic["gemm"]:
        assert system.gemm_ms(r["m"], r["n"], r["k"], r["gemm_dtype"]) == pytest.approx(r["latency"], rel=1e-9), r


@pytest.mark.parametrize("table", ["context_attention_perf", "generation_attention_perf"])
def test_attention_at_measured_points_is_the_parquet_value(system, aic, table):
    for r in aic[table]:
        heads = (r["num_heads"], r["num_key_value_heads"], r["head_dim"])
        got = system.attention_ms(table, r["batch_size"], r["isl"] + r["step"], heads, r["kv_cache_dtype"])
        assert got == pytest.approx(r["latency"], rel=1e-9), r


def test_allreduce_at_measured_points_is_the_newest_versions_value(system, aic):
    system.allreduce_ms(2, 1024)
    rows = aic["allreduce"][system.versions["comm"]]
    assert system.versions["comm"] == max(aic["allreduce"], key=lambda v: [int(x) if x.isdigit() else x for x in
                                                                           v.replace("rc", ".").split(".")])
    for r in rows:
        assert system.allreduce_ms(r["num_gpus"], r["message_size"]) == pytest.approx(r["latency"], rel=1e-9), r


# trtpd operator -> AIC's names, and how close trtpd must be: GEMM shapes collected in the table (QKV, O; the
# LM head is bf16 at a collected k) and the measured all-reduce agree to interpolation; the MLP GEMMs
# (28672 x 8192 and 8192 x 14336 at TP2) are not collected: AIC transfers efficiency from several nearby
# shapes (log-distance weighted), trtpd scales the nearest one by n x k, within 10% of each other. Decode
# attention is the generation table's; context attention has AIC's fused extras on top (the test after).
OPS = {"qkv_gemm": (("qkv_gemm",), 0.01), "proj_gemm": (("proj_gemm",), 0.01),
       "gate_ffn1_gemm": (("gate_ffn1_gemm",), 0.10), "ffn2_gemm": (("ffn2_gemm",), 0.10),
       "attention": (("attention",), 0.03), "all_reduce": (("ar_1", "ar_2"), 0.01),
       "logits_gemm": (("logits_gemm",), 0.01)}


@pytest.mark.parametrize("case", ["decode_b32_ctx1024", "decode_b128_ctx4096", "context_b1_isl2048",
                                  "context_b4_isl1024"])
def test_operators_match_aiconfigurators_own_estimate(system, aic, case):
    est = aic["estimates"][case]
    assert est["quant"] == ["fp8", "fp8", "bfloat16"]
    c = AicComposer(system, get_model("llama-3.1-70b"), 2, "fp8", "fp8")
    kind, b, n = case.split("_")
    batch, length = int(b[1:]), int(n.lstrip("ctxisl"))
    ours = c.decode_ops_ms(batch, length) if kind == "decode" else c.context_ops_ms(batch, length)
    prefix = "generation_" if kind == "decode" else "context_"
    total_aic = total_ours = 0.0
    for op, (names, tol) in OPS.items():
        theirs = sum(est["ops"][prefix + name] for name in names)
        if not (kind == "context" and op == "attention"):        # see the next test
            assert ours[op] == pytest.approx(theirs, rel=tol), (case, op, ours[op], theirs)
        total_aic, total_ours = total_aic + theirs, total_ours + ours[op]
    assert total_ours == pytest.approx(total_aic, rel=0.05)
    assert set(system.versions.values()) == {est["version"]}
    # the step is the operators' sum
    step = c.decode_step_s(batch, length) if kind == "decode" else c.context_s(batch, length)
    assert step == pytest.approx(sum(ours.values()) / 1e3)
    assert math.isfinite(step) and step > 0


def test_context_attention_differs_from_aics_only_by_its_fused_extras(system, aic):
    """AIC adds to the measured FMHA the RoPE and KV-write kernels fused into it, as empirical memory ops
    (bytes / (bandwidth x an empirical scaling) + a constant latency, x 1.1) that do not depend on the batch
    or the sequence length here; trtpd's sum leaves them out. So AIC's minus trtpd's is the same offset at
    every shape, and small."""
    c = AicComposer(system, get_model("llama-3.1-70b"), 2, "fp8", "fp8")
    offsets = []
    for case, (batch, isl) in (("context_b1_isl2048", (1, 2048)), ("context_b4_isl1024", (4, 1024))):
        ours = c.context_ops_ms(batch, isl)["attention"]
        offsets.append(aic["estimates"][case]["ops"]["context_attention"] - ours)
    assert offsets[0] == pytest.approx(offsets[1], rel=0.02)
    assert 0 < offsets[0] / 80 < 0.03         # per layer: tens of microseconds


def test_profile_cli_reads_the_installed_database_through_the_aic_environment(system, tmp_path, capsys):
    """.venv has neither aiconfigurator-core nor pyarrow: `trtpd profile --from aiconfigurator` without
    --aic-db exports the installed tables through .venv-aic and builds the curves from them."""
    from trtpd.cli.main import main
    from trtpd.perf.hardware import load_hardware
    from trtpd.perf.measured import MeasuredPerfModel
    out = tmp_path / "h100-aic.yaml"
    assert main(["profile", "--from", "aiconfigurator", "--model", "llama-3.1-70b", "--tp", "2", "--system",
                 SYSTEM, "--output", str(out)]) == 0
    profile = load_hardware(str(out)).find_measured("llama-3.1-70b", 2, "fp8")
    c = AicComposer(system, get_model("llama-3.1-70b"), 2, "fp8", "fp8")
    perf = MeasuredPerfModel(profile)
    assert perf.decode_step_s(32, 32 * 1024) == pytest.approx(c.decode_step_s(32, 1024), rel=1e-9)
    assert perf.prefill_s(2048) == pytest.approx(c.prefill_s(2048), rel=1e-9)
    assert "aiconfigurator h100_sxm trtllm (gemm 1.3.0rc20" in capsys.readouterr().out
