"""`trtpd lint` on what `trtpd build --configs-only` wrote, and on two manifests alone."""

from __future__ import annotations

import json

import pytest

from trtpd.schema.manifest import write_manifest
from trtpd.cli.main import main
from trtpd.lint import RULES, discover, lint_deployment


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    engines = tmp_path_factory.mktemp("engines")
    tokenizer = tmp_path_factory.mktemp("checkpoint")
    (tokenizer / "tokenizer.json").write_text("{}")       # copied into deploy/tokenizer, which the servers read
    assert main(["build", "--model", "llama-3.1-8b", "--no-fp8", "--configs-only", "--engines-dir", str(engines),
                 "--tokenizer-dir", str(tokenizer)]) == 0
    return engines / "llama-3.1-8b"


def test_lint_of_a_fresh_build_has_no_errors(built, capsys):
    assert main(["lint", str(built), "--no-port-check"]) == 0
    out = capsys.readouterr().out
    assert "lint: 0 error(s), 2 warning(s), 2 note(s)" in out          # engines are only planned
    assert "[mpi-transfer-limits]" in out and "restart launch_triton.sh" in out
    assert "[transfer-timeout-scope]" in out                            # trtllm-serve --backend tensorrt
    assert out.count("[engine-status]") == 2


def test_discover_finds_every_part(built):
    paths = discover(built)
    assert paths.prefill_manifest.parent.name == "prefill-tp1"
    assert paths.decode_manifest.parent.name == "decode-tp1"
    assert paths.repo.name == "model_repository"
    assert paths.launch_script.name == "launch_triton.sh"
    assert paths.serve_dir.name == "trtllm-serve"
    findings = lint_deployment(paths, check_ports_free=False)
    assert {f.rule for f in findings} == {"engine-status", "mpi-transfer-limits", "transfer-timeout-scope"}


def test_lint_from_two_manifests_reports_mismatch(make, tmp_path, capsys):
    write_manifest(make.manifest("prefill", kv_dtype="fp8"), tmp_path / "p")
    write_manifest(make.manifest("decode", kv_dtype="fp16"), tmp_path / "d")
    code = main(["lint", "--prefill", str(tmp_path / "p"), "--decode", str(tmp_path / "d" / "manifest.json")])
    out = capsys.readouterr().out
    assert code == 1
    assert "error: [kv-dtype]" in out and "fix: rebuild both engines" in out


def test_broken_manifest_names_the_field(tmp_path, make, capsys):
    write_manifest(make.manifest("prefill"), tmp_path / "p")
    data = json.loads((tmp_path / "p" / "manifest.json").read_text())
    data["build_config"]["tokens_per_block"] = "many"
    (tmp_path / "p" / "manifest.json").write_text(json.dumps(data))
    write_manifest(make.manifest("decode"), tmp_path / "d")
    assert main(["lint", "--prefill", str(tmp_path / "p"), "--decode", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "build_config.tokens_per_block" in err and "manifest.json" in err


def test_list_rules(capsys):
    assert main(["lint", "--list-rules"]) == 0
    out = capsys.readouterr().out
    assert all(rule in out for rule in RULES)


def test_nothing_to_lint_is_an_error(capsys):
    assert main(["lint"]) == 2
    assert "nothing to lint" in capsys.readouterr().err


def test_serve_dir_alone_reads_decode_num_tokens_from_launch(tmp_path):
    from trtpd.lint import DeploymentPaths
    (tmp_path / "prefill.yaml").write_text("cache_transceiver_config: {backend: UCX, max_tokens_in_buffer: 4096, "
                                           "kv_transfer_timeout_ms: 60000}\nkv_cache_config: {enable_block_reuse: false}\n")
    (tmp_path / "decode.yaml").write_text("cache_transceiver_config: {backend: UCX, max_tokens_in_buffer: 4096, "
                                          "kv_transfer_timeout_ms: 60000}\nenable_chunked_prefill: false\n")
    (tmp_path / "launch.sh").write_text("export UCX_MEMTYPE_CACHE=n\nexport UCX_CUDA_IPC_ENABLE_MNNVL=n\n"
                                        "trtllm-serve e --backend tensorrt --max_num_tokens 256 "
                                        "--extra_llm_api_options ./decode.yaml &\n")
    findings = lint_deployment(DeploymentPaths(serve_dir=tmp_path), max_prompt_tokens=2048, check_ports_free=False)
    assert [f.rule for f in findings] == ["decode-num-tokens", "transfer-timeout-scope"]


def test_lint_of_a_build_without_a_local_tokenizer_names_it(tmp_path, capsys, monkeypatch):
    engines = tmp_path / "engines"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    assert main(["build", "--model", "llama-3.1-8b", "--no-fp8", "--configs-only", "--engines-dir", str(engines)]) == 0
    capsys.readouterr()
    assert main(["lint", str(engines / "llama-3.1-8b"), "--no-port-check"]) == 1
    out = capsys.readouterr().out
    assert out.count("error: [tokenizer]") == 2 and "deploy/tokenizer/tokenizer.json does not exist" in out


def test_lint_of_a_build_reads_both_trtllm_serve_folders(tmp_path, capsys, monkeypatch):
    engines = tmp_path / "engines"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))        # no tokenizer: an error either way
    assert main(["build", "--model", "llama-2-70b", "--configs-only", "--engines-dir", str(engines)]) == 0
    serve = engines / "llama-2-70b" / "deploy" / "serve-pytorch"
    (serve / "decode.yaml").write_text((serve / "decode.yaml").read_text().replace("backend: UCX", "backend: ucx"))
    capsys.readouterr()
    assert main(["lint", str(engines / "llama-2-70b"), "--no-port-check"]) == 1
    out = capsys.readouterr().out
    assert f"error: [transceiver-backend] {serve}/decode.yaml: cache_transceiver_config.backend: 'ucx'" in out
    assert main(["lint", str(engines / "llama-2-70b"), "--no-port-check", "--serve-dir",
                 str(serve.parent / "trtllm-serve")]) == 1          # the tokenizer is missing; serve-pytorch/ not read
    assert "transceiver-backend" not in capsys.readouterr().out
