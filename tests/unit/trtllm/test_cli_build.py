"""`trtpd build` from the command line: dry run, configs only, bad input, missing TensorRT-LLM,
and the dispatch of --backend reference."""

from __future__ import annotations

import importlib.util

import pytest

from trtpd.cli.main import main


def run(*argv) -> int:
    return main(["build", *argv])


def test_dry_run_prints_commands_and_writes_nothing(tmp_path, capsys):
    assert run("--model", "llama-2-70b", "--prefill-tp", "2", "--decode-tp", "4", "--dry-run",
               "--engines-dir", str(tmp_path / "engines")) == 0
    out = capsys.readouterr().out
    assert "python3 /app/examples/quantization/quantize.py" in out        # the Triton 26.04 container's layout
    assert out.count("trtllm-build --checkpoint_dir") == 2
    assert "dry run: nothing was written" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("container, examples", [("triton-26.04", "/app/examples"),
                                                 ("trtllm-1.2.1", "/app/tensorrt_llm/examples")])
def test_container_picks_the_examples_folder(tmp_path, capsys, container, examples):
    assert run("--model", "llama-3.1-8b", "--kv-dtype", "fp16", "--container", container, "--dry-run",
               "--engines-dir", str(tmp_path)) == 0
    assert f"python3 {examples}/models/core/llama/convert_checkpoint.py" in capsys.readouterr().out


def test_a_container_with_another_tensorrt_llm_is_refused_with_the_one_to_use(tmp_path, capsys):
    assert run("--model", "llama-2-70b", "--container", "triton-25.12", "--dry-run", "--engines-dir", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "tritonserver:25.12-trtllm-python-py3 ships TensorRT-LLM 1.1.0" in err
    assert "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 (--container triton-26.04" in err


def test_trtllm_examples_overrides_the_container(tmp_path, capsys):
    assert run("--model", "llama-2-70b", "--container", "trtllm-1.2.1", "--trtllm-examples", "/opt/ex", "--dry-run",
               "--engines-dir", str(tmp_path)) == 0
    assert "python3 /opt/ex/quantization/quantize.py" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--model", "llama-2-70b", "--decode-tp", "3"], "--decode-tp 3 does not divide"),
    (["--model", "llama-2-70b", "--max-input-len", "4000"], "exceeds llama-2-70b's max_position_embeddings 4096"),
    (["--model", "llama-2-70b", "--kv-dtype", "fp16", "--fp8"], "--kv-dtype fp16 contradicts --fp8"),
])
def test_bad_input_is_refused_with_nothing_written(tmp_path, capsys, argv, message):
    for mode in ("--configs-only", "--dry-run"):
        assert run(*argv, mode, "--engines-dir", str(tmp_path)) == 2
        assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_folder_without_config_json(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    assert run("--model", str(ckpt), "--configs-only", "--engines-dir", str(tmp_path / "engines")) == 2
    assert "no config.json in this checkpoint folder" in capsys.readouterr().err
    assert not (tmp_path / "engines").exists()


def test_configs_only_writes_deploy_and_planned_manifests(tmp_path, capsys):
    argv = ("--model", "llama-3.1-8b", "--kv-dtype", "fp16", "--configs-only", "--engines-dir", str(tmp_path))
    assert run(*argv) == 0
    model_dir = tmp_path / "llama-3.1-8b"
    assert (model_dir / "prefill-tp1" / "manifest.json").is_file()
    assert (model_dir / "deploy" / "trtllm-serve" / "disagg.yaml").is_file()
    assert run(*argv) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert run(*argv, "--force") == 0


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="tensorrt_llm is installed here")
def test_without_tensorrt_llm_a_real_build_points_to_dry_run(tmp_path, capsys):
    assert run("--model", "llama-3.1-8b", "--engines-dir", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "tensorrt_llm is not importable" in err and "--dry-run" in err
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def fake_reference(monkeypatch):
    calls = []

    def build_reference(model, engines_dir, *, kv_dtype="fp16", tokens_per_block=32, max_input_len=2048,
                        max_output_len=512, force=False, progress=None):
        calls.append((model, engines_dir, kv_dtype, tokens_per_block, max_input_len, max_output_len, force))
        return []

    import trtpd.engine.reference_engines
    monkeypatch.setattr(trtpd.engine.reference_engines, "build_reference", build_reference)
    return calls


def test_reference_backend_is_dispatched(fake_reference, tmp_path):
    assert run("--backend", "reference", "--model", "tiny-llama", "--kv-dtype", "fp8", "--tokens-per-block", "16",
               "--engines-dir", str(tmp_path)) == 0
    assert fake_reference == [("tiny-llama", tmp_path, "fp8", 16, 2048, 512, False)]


def test_reference_backend_defaults_to_fp16_and_refuses_tp(fake_reference, tmp_path, capsys):
    assert run("--backend", "reference", "--model", "tiny-llama", "--engines-dir", str(tmp_path)) == 0
    assert fake_reference[0][2] == "fp16"
    assert run("--backend", "reference", "--model", "tiny-llama", "--prefill-tp", "2") == 2
    assert "reference backend runs TP1" in capsys.readouterr().err


def test_reference_dry_run_writes_nothing(fake_reference, tmp_path, capsys):
    assert run("--backend", "reference", "--model", "tiny-llama", "--dry-run", "--engines-dir", str(tmp_path)) == 0
    assert "would run: build_reference('tiny-llama'" in capsys.readouterr().out
    assert fake_reference == [] and list(tmp_path.iterdir()) == []


def _example_plan(tmp_path):
    """The bundled Llama-2-70B example plan (its lengths fit the model's 4,096 positions)."""
    from trtpd.resources import configs_dir
    return configs_dir("plans") / "example-llama-2-70b-h100-chat-40rps.yaml"


def test_plan_supplies_tp_counts_batches_and_lengths(tmp_path, capsys):
    from trtpd.schema.plan import load_plan
    plan = load_plan(_example_plan(tmp_path))
    p, d = plan.prefill, plan.decode
    assert run("--model", "llama-2-70b", "--plan", str(_example_plan(tmp_path)), "--dry-run",
               "--engines-dir", str(tmp_path / "engines")) == 0
    out = capsys.readouterr().out
    assert (f"prefill: TP{p.tp} PP1 x{p.num_instances}, max_batch_size {p.max_batch_size}, max_num_tokens "
            f"{p.max_num_tokens}, max_input_len {p.max_input_len}, max_seq_len {d.max_seq_len}") in out
    assert (f"decode:  TP{d.tp} PP1 x{d.num_instances}, max_batch_size {d.max_batch_size}, max_num_tokens "
            f"{d.max_num_tokens}, max_input_len {d.max_input_len}, max_seq_len {d.max_seq_len}") in out
    assert d.max_num_tokens < d.max_input_len and "lint: 0 error(s)" in out   # decode runs chunked context
    assert "--kv_cache_dtype fp8" in out and "--tokens_per_block 32" in out


@pytest.mark.parametrize("extra, message", [
    (("--decode-tp", "4"), "--decode-tp 4 contradicts"),
    (("--kv-dtype", "fp16"), "--kv-dtype fp16 contradicts"),
])
def test_a_flag_contradicting_the_plan_is_refused(tmp_path, capsys, extra, message):
    assert run("--model", "llama-2-70b", "--plan", str(_example_plan(tmp_path)), *extra, "--dry-run",
               "--engines-dir", str(tmp_path / "engines")) == 2
    assert message in capsys.readouterr().err


def test_a_plan_for_another_model_is_refused(tmp_path, capsys):
    assert run("--model", "llama-3.1-8b", "--plan", str(_example_plan(tmp_path)), "--dry-run",
               "--engines-dir", str(tmp_path / "engines")) == 2
    assert "the plan is for model llama-2-70b" in capsys.readouterr().err


def test_configs_only_writes_the_pytorch_backend_folder_with_the_modelopt_checkout(tmp_path, capsys):
    argv = ("--model", "llama-2-70b", "--prefill-tp", "2", "--decode-tp", "4", "--modelopt-dir", "/opt/Model-Optimizer",
            "--configs-only", "--engines-dir", str(tmp_path))
    assert run(*argv) == 0
    serve = tmp_path / "llama-2-70b" / "deploy" / "serve-pytorch"
    assert sorted(p.name for p in serve.iterdir()) == ["checkpoint.sh", "decode.yaml", "disagg.yaml", "launch.sh",
                                                       "prefill.yaml"]
    assert 'MODELOPT_DIR="${MODELOPT_DIR:-/opt/Model-Optimizer}"' in (serve / "checkpoint.sh").read_text()
    out = capsys.readouterr().out
    assert "trtllm-serve --backend pytorch (serve-pytorch/, no engine): loads " in out
