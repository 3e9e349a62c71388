"""scripts/gpu_smoke.py: its commands, requests and designed outputs checked here; the run itself needs a GPU box."""

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
# The fields of TensorRT-LLM's CompletionRequest the smoke sends (tensorrt_llm/serve/openai_protocol.py; the
# model forbids unknown fields, so a wrong name is a 400, not a silently ignored option).
SERVE_FIELDS = {"model", "prompt", "max_tokens", "top_k", "stream", "stop_token_ids"}
HIDES_EOS = {"min_length", "min_tokens", "ignore_eos"}


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
    (cfg.model_dir / "tokenizer.json").write_text("{}")     # write_model's save_pretrained writes the real one
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
    assert f"--http-port={cfg.http_port}" in triton and f"--metrics-port={cfg.metrics_port}" in triton
    router = (cfg.deploy_dir / "trtllm-serve" / "disagg.yaml").read_text()
    assert f"port: {cfg.router_port}" in router
    decode = (cfg.deploy_dir / "model_repository" / "decode" / "config.pbtxt").read_text()
    assert 'key: "gpu_device_ids"\n  value: {\n    string_value: "1"' in decode    # decode on GPU 1
    assert main(["lint", str(cfg.engines_dir / "smoke-llama"), "--no-port-check"]) == 0


def test_each_kind_of_stop_is_designed_in(smoke, cfg):
    cases = smoke.smoke_cases(cfg)
    kinds = {k: [c for c in cases if c.kind == k] for k in ("eos", "end_id", "length")}
    assert all(len(v) == cfg.prompts_per_kind for v in kinds.values())
    for case in kinds["eos"]:          # the chain reaches </s> well before max_tokens, with no end_id given
        assert case.stop_id is None and 0 < len(case.expected_ids) < cfg.max_tokens
        assert smoke.successor(case.expected_ids[-1]) == smoke.EOS_ID
    for case in kinds["end_id"]:       # the end_id token ends it and is not emitted
        assert case.stop_id not in case.expected_ids and smoke.successor(case.expected_ids[-1]) == case.stop_id
        assert len(case.expected_ids) < cfg.max_tokens
    for case in kinds["length"]:
        assert case.stop_id is None and len(case.expected_ids) == cfg.max_tokens
        assert smoke.EOS_ID not in case.expected_ids


def test_the_chain_weights_put_each_successor_far_ahead(smoke):
    """The lm_head on a token's own (RMS-normalized) embedding: the successor wins by a wide margin, so fp16
    and FP8 rounding cannot change a greedy token (the container also checks the whole model with transformers)."""
    torch = pytest.importorskip("torch")
    vocab_size = len(smoke.vocab())
    embed, lm_head = smoke.chain_weights(vocab_size)
    hidden = embed / embed.pow(2).mean(dim=1, keepdim=True).sqrt()
    logits = hidden @ lm_head.T
    top2 = logits.topk(2, dim=1)
    assert top2.indices[:, 0].tolist() == [smoke.successor(t) for t in range(vocab_size)]
    assert (top2.values[:, 0] - top2.values[:, 1]).min().item() > 10


def test_triton_requests_use_declared_inputs_and_hide_no_eos(smoke, cfg):
    declared = set(re.findall(r'\{ name: "(\w+)"', ENSEMBLE.read_text().split("output [")[0]))
    requests = smoke.triton_requests(cfg)
    assert len(requests) == 2 * 3 * cfg.prompts_per_kind and sum(s for _, _, s, _ in requests) == len(requests) // 2
    for url, body, streamed, case in requests:
        assert set(body) <= declared, set(body) - declared
        assert not set(body) & HIDES_EOS
        assert url.endswith("/generate_stream" if streamed else "/generate")
        assert ("end_id" in body) == (case.kind == "end_id")
        assert body["text_input"].split()[-1] == smoke.text_of(case.prompt_ids[-1:])


def test_serve_requests_send_only_completion_request_fields(smoke, cfg):
    requests = smoke.serve_requests(cfg)
    assert len(requests) == 2 * 3 * cfg.prompts_per_kind
    for url, body, _, case in requests:
        assert url.endswith(f":{cfg.router_port}/v1/completions")
        assert set(body) <= SERVE_FIELDS and not set(body) & HIDES_EOS
        assert body.get("stop_token_ids") == ([case.stop_id] if case.kind == "end_id" else None)


def test_print_plan_runs_nothing(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--print-plan", "--work-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["build"][0] == "build" and len(plan["triton_requests"]) == len(plan["serve_requests"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
@pytest.mark.trtllm
@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is None or shutil.which("nvidia-smi") is None,
                    reason="needs the TensorRT-LLM 1.2.1 container on a box with 2 GPUs")
def test_gpu_smoke_runs_end_to_end(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--work-dir", str(tmp_path)], text=True, timeout=3600)
    assert out.returncode == 0
