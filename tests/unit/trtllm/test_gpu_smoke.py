"""scripts/gpu_smoke.py: its commands and requests checked here; the run itself needs a GPU box."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trtpd.cli.main import main

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu_smoke.py"
ENSEMBLE = Path(__file__).resolve().parents[3] / "triton_models" / "ensemble" / "config.pbtxt.tmpl"


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = module       # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gpu_smoke", None)


@pytest.fixture
def cfg(smoke, tmp_path):
    cfg = smoke.SmokeConfig(work_dir=tmp_path)
    cfg.model_dir.mkdir(parents=True)
    (cfg.model_dir / "config.json").write_text(json.dumps(smoke.tiny_llama_config(len(smoke.vocab()))))
    return cfg


def test_the_build_command_plans_and_lints_clean_here(smoke, cfg, capsys):
    argv = smoke.build_argv(cfg)
    assert argv[-1] == "--force"
    assert main(argv[:-1] + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "lint: 0 error(s), 0 warning(s)" in out
    assert "convert_checkpoint.py" in out and out.count("trtllm-build --checkpoint_dir") == 2


def test_launch_and_ready_targets_exist_after_rendering(smoke, cfg):
    assert main(smoke.build_argv(cfg)[:-1] + ["--configs-only"]) == 0
    for argv in smoke.launch_commands(cfg).values():
        assert Path(argv[-1]).is_file(), argv
    triton = (cfg.deploy_dir / "launch_triton.sh").read_text()
    assert f"--http-port={cfg.http_port}" in triton
    router = (cfg.deploy_dir / "trtllm-serve" / "disagg.yaml").read_text()
    assert f"port: {cfg.router_port}" in router
    decode = (cfg.deploy_dir / "model_repository" / "decode" / "config.pbtxt").read_text()
    assert 'key: "gpu_device_ids"\n  value: {\n    string_value: "1"' in decode    # decode on GPU 1
    assert main(["lint", str(cfg.engines_dir / "smoke-llama"), "--no-port-check"]) == 0


def test_requests_use_only_inputs_the_ensemble_declares(smoke, cfg):
    declared = set(re.findall(r'\{ name: "(\w+)"', ENSEMBLE.read_text().split("output [")[0]))
    requests = smoke.triton_requests(cfg)
    assert len(requests) == 20 and sum(s for _, _, s in requests) == 5
    for url, body, streamed in requests:
        assert set(body) <= declared, set(body) - declared
        assert url.endswith("/generate_stream" if streamed else "/generate")
        assert body["min_length"] == body["max_tokens"] == cfg.max_tokens
    serve = smoke.serve_requests(cfg)
    assert len(serve) == 20 and all(u.endswith(f":{cfg.router_port}/v1/completions") for u, _, _ in serve)


def test_print_plan_runs_nothing(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--print-plan", "--work-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["build"][0] == "build"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
@pytest.mark.trtllm
@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is None or shutil.which("nvidia-smi") is None,
                    reason="needs the TensorRT-LLM 1.2.1 container on a box with 2 GPUs")
def test_gpu_smoke_runs_end_to_end(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--work-dir", str(tmp_path)], text=True, timeout=3600)
    assert out.returncode == 0
