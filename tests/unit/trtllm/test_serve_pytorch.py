"""serve-pytorch/: the trtllm-serve deployment on the PyTorch backend, planned from the same request as the engines.

Every key and flag is also checked against the options table in test_options_table.py; the lint rules it must
pass have firing and quiet cases in tests/unit/lint/test_rules.py.
"""

from __future__ import annotations

import os
import shlex

import pytest
import yaml

from trtpd.errors import ConfigError
from trtpd.lint.findings import errors
from trtpd.trtllm.mpi_world import plan_mpi_world
from trtpd.trtllm.plan import plan_build
from trtpd.trtllm.run import prepare, write_configs
from trtpd.trtllm.serve_config import ServeLayout
from trtpd.trtllm.serve_pytorch import render_pytorch_serve_files

DIR = "serve-pytorch"


def files_for(request_for, model: str = "llama-2-70b", layout: ServeLayout = ServeLayout(),
              **overrides) -> dict[str, str]:
    plan = plan_build(request_for(model, **overrides))
    return render_pytorch_serve_files(plan, plan_mpi_world(plan.request), layout, DIR)


def load(files, name):
    return yaml.safe_load(files[f"{DIR}/{name}"])


def servers(files) -> list[list[str]]:
    """Each server's argv, with its CUDA_VISIBLE_DEVICES as the first element."""
    return [shlex.split(line.split(" > ")[0]) for line in files[f"{DIR}/launch.sh"].splitlines()
            if line.startswith("CUDA_VISIBLE_DEVICES=")]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_fp8_role_options_carry_the_plan_and_what_disaggregation_needs(request_for):
    files = files_for(request_for, prefill_tp=2, decode_tp=4, fp8=True)
    prefill, decode = load(files, "prefill.yaml"), load(files, "decode.yaml")
    assert prefill["kv_cache_config"] == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.85,
                                          "tokens_per_block": 32, "dtype": "fp8"}
    assert decode["kv_cache_config"] == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.85,
                                         "tokens_per_block": 32, "dtype": "fp8", "max_tokens": 655360}
    for options in (prefill, decode):
        assert options["cache_transceiver_config"] == {"backend": "UCX", "max_tokens_in_buffer": 2048 + 32,
                                                       "kv_transfer_timeout_ms": 60000}
        assert options["enable_iter_perf_stats"] is True
        assert "extended_runtime_perf_knob_config" not in options         # TrtLlmArgs only: TorchLlmArgs refuses it
    assert (prefill["disable_overlap_scheduler"], decode["disable_overlap_scheduler"]) == (True, False)
    assert (prefill["max_batch_size"], prefill["max_num_tokens"], prefill["enable_chunked_prefill"]) == (256, 8192, False)
    assert (decode["max_batch_size"], decode["max_num_tokens"], decode["enable_chunked_prefill"]) == (256, 256, True)


def test_without_fp8_the_kv_dtype_is_the_checkpoints(request_for):
    files = files_for(request_for, "llama-3.1-8b", prefill_tp=1, decode_tp=1, fp8=False)
    for role in ("prefill", "decode"):
        assert "dtype" not in load(files, f"{role}.yaml")["kv_cache_config"]


def test_fp8_weights_are_one_hf_ptq_calibration_that_both_roles_load(request_for, tmp_path):
    files = files_for(request_for, prefill_tp=2, decode_tp=4, fp8=True, engines_dir=tmp_path)
    checkpoint = f"{tmp_path}/llama-2-70b/checkpoints/hf-fp8"
    script = files[f"{DIR}/checkpoint.sh"]
    assert (f'python3 "$MODELOPT_DIR/examples/llm_ptq/hf_ptq.py" --pyt_ckpt_path meta-llama/Llama-2-70b-hf '
            f"--qformat fp8 --kv_cache_qformat fp8 --calib_size 512 --dataset cnn_dailymail --export_path "
            f"{checkpoint}\n") in script
    assert 'MODELOPT_DIR="${MODELOPT_DIR:-}"' in script and "tag 0.37.0" in script
    assert {argv[2] for argv in servers(files)} == {checkpoint}            # TP2 and TP4 read the same export
    launch = files[f"{DIR}/launch.sh"]
    assert launch.index(f'if [ ! -f "{checkpoint}/.trtpd-checkpoint-complete" ]') < launch.index("CUDA_VISIBLE_DEVICES=")


def test_modelopt_dir_is_written_into_the_checkpoint_script_and_refused_without_fp8(request_for):
    files = files_for(request_for, fp8=True, modelopt_dir="/opt/Model-Optimizer")
    assert 'MODELOPT_DIR="${MODELOPT_DIR:-/opt/Model-Optimizer}"' in files[f"{DIR}/checkpoint.sh"]
    with pytest.raises(ConfigError, match=r"--modelopt-dir /opt/m: only FP8 weights need ModelOpt's hf_ptq.py"):
        request_for("llama-3.1-8b", fp8=False, modelopt_dir="/opt/m")


def test_a_local_checkpoint_is_served_as_it_is_and_a_hub_model_is_fetched_once(request_for, tmp_path):
    local = tmp_path / "Llama-3.1-8B"
    local.mkdir()
    files = files_for(request_for, "llama-3.1-8b", fp8=False, hf_model=str(local))
    assert f"{DIR}/checkpoint.sh" not in files and {argv[2] for argv in servers(files)} == {str(local)}
    assert ".trtpd-checkpoint-complete" not in files[f"{DIR}/launch.sh"]
    hub = files_for(request_for, "llama-3.1-8b", fp8=False, engines_dir=tmp_path / "engines")
    fetched = f"{tmp_path}/engines/llama-3.1-8b/checkpoints/hf"
    assert f"hf download meta-llama/Llama-3.1-8B --local-dir {fetched}\n" in hub[f"{DIR}/checkpoint.sh"]
    assert {argv[2] for argv in servers(hub)} == {fetched}


def test_one_server_per_instance_on_its_gpus_registering_with_the_router(request_for):
    layout = ServeLayout(router_port=9000, first_worker_port=9100)
    files = files_for(request_for, layout=layout, prefill_tp=2, decode_tp=2, prefill_instances=2, decode_instances=1,
                      fp8=True)
    argvs = servers(files)
    assert [(a[0], flag(a, "--server_role"), flag(a, "--port"), flag(a, "--tp_size")) for a in argvs] == [
        ("CUDA_VISIBLE_DEVICES=0,1", "CONTEXT", "9100", "2"), ("CUDA_VISIBLE_DEVICES=2,3", "CONTEXT", "9101", "2"),
        ("CUDA_VISIBLE_DEVICES=4,5", "GENERATION", "9102", "2")]
    for argv in argvs:
        assert flag(argv, "--backend") == "pytorch" and flag(argv, "--disagg_cluster_uri") == "http://localhost:9000"
        assert flag(argv, "--extra_llm_api_options") in ("./prefill.yaml", "./decode.yaml")
        assert flag(argv, "--tokenizer").endswith("/llama-2-70b/deploy/tokenizer")
    router = load(files, "disagg.yaml")
    assert router == {"hostname": "localhost", "port": 9000, "disagg_cluster": {
        "cluster_uri": "http://localhost:9000", "cluster_name": "trtpd-llama-2-70b",
        "minimal_instances": {"context_servers": 2, "generation_servers": 1},
        "heartbeat_interval_sec": 5, "inactive_timeout_sec": 10}}
    cluster = {k: v for k, v in router["disagg_cluster"].items() if k != "minimal_instances"}
    assert load(files, "prefill.yaml")["disagg_cluster"] == load(files, "decode.yaml")["disagg_cluster"] == cluster
    assert files[f"{DIR}/launch.sh"].rstrip().endswith("exec trtllm-serve disaggregated -c disagg.yaml -t 900 -r 180")


def test_nixl_is_carried_to_both_roles(request_for):
    files = files_for(request_for, fp8=True, transceiver_backend="nixl")
    assert {load(files, f"{r}.yaml")["cache_transceiver_config"]["backend"] for r in ("prefill", "decode")} == {"NIXL"}


@pytest.mark.parametrize("case", ["llama-2-70b-tp4-tp4-fp8", "llama-2-70b-tp2-tp4-fp8", "llama-3.1-8b-tp1-tp1-fp16"])
def test_the_planned_folder_passes_lint_and_its_timeout_is_one_the_backend_enforces(case, golden_cases, request_for):
    model, overrides = golden_cases[case]
    prepared = prepare(request_for(model, **overrides))
    mine = [f for f in prepared.findings if DIR in f.subject]
    assert mine == [], [f.format() for f in mine]          # transfer-timeout-scope fires for --backend tensorrt only
    assert any(f.rule == "transfer-timeout-scope" and "trtllm-serve/launch.sh" in f.subject for f in prepared.findings)


def test_configs_only_writes_the_folder_and_trtpd_lint_reads_it(request_for, tmp_path):
    from trtpd.lint import discover, lint_deployment
    prepared = prepare(request_for(prefill_tp=2, decode_tp=4, fp8=True, engines_dir=tmp_path))
    deploy = write_configs(prepared, force=False)
    for script in ("launch.sh", "checkpoint.sh"):
        assert os.access(deploy / DIR / script, os.X_OK)
    paths = discover(tmp_path / "llama-2-70b")
    assert paths.serve_pytorch_dir == deploy / DIR
    findings = [f for f in lint_deployment(paths, check_ports_free=False) if DIR in f.subject]
    assert errors(findings) == [] and [f.rule for f in findings] == []
    (deploy / DIR / "prefill.yaml").write_text((deploy / DIR / "prefill.yaml").read_text().replace(
        "disable_overlap_scheduler: true", "disable_overlap_scheduler: false"))
    refused = [f for f in lint_deployment(paths, check_ports_free=False) if DIR in f.subject]
    assert [(f.rule, f.severity) for f in refused] == [("context-overlap-scheduler", "error")]
