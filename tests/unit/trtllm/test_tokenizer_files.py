"""The GPU deployment's tokenizer is a copy in the deploy folder: every server reads it from there, nothing names a
hub id or mounts a Hugging Face cache, and nothing downloads. trtpd build copies it from --tokenizer-dir, the model
folder or the local hub cache (laid out as huggingface_hub lays it out), and says what to do when none is local."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from trtpd.engine.text_tokenizers import load_text_tokenizer
from trtpd.engine.tokenizer import Tokenizer
from trtpd.errors import ConfigError
from trtpd.schema.pbtxt import parse_model_config
from trtpd.trtllm.deploy import write_deploy
from trtpd.trtllm.environment import BuildEnvironment
from trtpd.trtllm.run import prepare, run_build, write_configs
from trtpd.trtllm.spec import BuildOverrides, make_request
from trtpd.trtllm.tokenizer_files import hub_cache_dir, hub_snapshot, tokenizer_source

HUB_ID = "meta-llama/Llama-3.1-8B"


def write_tokenizer(folder: Path) -> Tokenizer:
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.train("the quick brown fox jumps over the lazy dog " * 20, 400)
    tok.save(folder / "tokenizer.json")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model-00001-of-00004.safetensors").write_bytes(b"weights are not copied")
    return tok


def fake_hub_cache(cache: Path, repo_id: str = HUB_ID) -> Path:
    """models--org--name/refs/main -> snapshots/<commit>/, files as symlinks into blobs/ (huggingface_hub's layout)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    write_tokenizer(repo / "blobs-src")
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, f in enumerate(sorted((repo / "blobs-src").iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        f.rename(blob)
        (snapshot / f.name).symlink_to(Path("../../blobs") / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf-hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_hub_cache_location_follows_huggingface_hub(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", "/data/hf")
    assert hub_cache_dir() == Path("/data/hf/hub")
    monkeypatch.setenv("HF_HUB_CACHE", "/fast/hub")                   # takes priority over HF_HOME
    assert hub_cache_dir() == Path("/fast/hub")


def test_a_cached_hub_snapshot_is_found_without_the_network(hub_cache):
    snapshot = fake_hub_cache(hub_cache)
    assert hub_snapshot(HUB_ID) == snapshot
    assert tokenizer_source(HUB_ID)[0] == snapshot
    assert hub_snapshot("meta-llama/Llama-2-70b-hf") is None


def served_paths(deploy_dir: Path) -> dict[str, str]:
    """Every place a GPU deployment names its tokenizer."""
    paths = {}
    for model in ("preprocessing", "postprocessing"):
        path = deploy_dir / "model_repository" / model / "config.pbtxt"
        config = parse_model_config(path.read_text(), source=str(path))
        paths[model] = config.parameters["tokenizer_dir"].string_value
    for folder in ("trtllm-serve", "serve-pytorch"):
        launch = (deploy_dir / folder / "launch.sh").read_text().split()
        paths.update({f"{folder}/launch.sh {i}": launch[n + 1] for i, n in enumerate(
            n for n, arg in enumerate(launch) if arg == "--tokenizer")})
    compose = yaml.safe_load((deploy_dir / "containers" / "compose.trtllm-serve.yaml").read_text())
    for name, service in compose["services"].items():
        if "--tokenizer" in service["command"]:
            paths[f"compose {name}"] = service["command"][service["command"].index("--tokenizer") + 1]
    return paths


def test_every_server_reads_the_deploy_folders_copy_and_nothing_downloads(request_for, hub_cache, tmp_path):
    fake_hub_cache(hub_cache)
    prepared = prepare(request_for("llama-3.1-8b", prefill_tp=1, decode_tp=1, fp8=False, engines_dir=tmp_path))
    deploy_dir = write_configs(prepared, force=False)
    tokenizer = deploy_dir / "tokenizer"
    paths = served_paths(deploy_dir)
    assert len(paths) == 8 and set(paths.values()) == {str(tokenizer)}
    assert sorted(p.name for p in tokenizer.iterdir()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert not any(p.is_symlink() for p in tokenizer.iterdir())      # the blobs' content, not links into the cache
    assert load_text_tokenizer(tokenizer).decode(load_text_tokenizer(tokenizer).encode("the lazy dog")) == "the lazy dog"
    # serve-pytorch/checkpoint.sh is a build step, not a server: it fetches the hub model once (as the engine path's
    # convert step does), and the PyTorch servers then load that local copy
    fetch = deploy_dir / "serve-pytorch" / "checkpoint.sh"
    assert f"hf download {HUB_ID} --local-dir {tmp_path}/llama-3.1-8b/checkpoints/hf" in fetch.read_text()
    text = "\n".join(p.read_text() for p in deploy_dir.rglob("*") if p.is_file() and p != fetch
                     and p.suffix in ("", ".sh", ".yaml", ".pbtxt"))
    assert HUB_ID not in text and "huggingface" not in text and "HF_TOKEN" not in text
    assert f"trtllm-serve {tmp_path}/llama-3.1-8b/checkpoints/hf --backend pytorch" in text
    compose = yaml.safe_load((deploy_dir / "containers" / "compose.triton.yaml").read_text())
    assert compose["services"]["triton"]["volumes"] == [f"{tmp_path}/llama-3.1-8b:{tmp_path}/llama-3.1-8b"]


def test_tokenizer_dir_is_copied_from_a_folder(request_for, hub_cache, tmp_path):
    source = tmp_path / "my-checkpoint"
    write_tokenizer(source)
    prepared = prepare(request_for("llama-3.1-8b", fp8=False, engines_dir=tmp_path / "engines"),
                       tokenizer_dir=str(source))
    deploy_dir = write_configs(prepared, force=False)
    assert (deploy_dir / "tokenizer" / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert not (deploy_dir / "tokenizer" / "model-00001-of-00004.safetensors").exists()


def test_configs_only_without_a_local_tokenizer_writes_launch_scripts_that_stop_at_start(request_for, hub_cache,
                                                                                          tmp_path):
    deploy_dir = write_configs(prepare(request_for("llama-3.1-8b", fp8=False, engines_dir=tmp_path)), force=False)
    assert not (deploy_dir / "tokenizer").exists()
    out = subprocess.run(["bash", str(deploy_dir / "trtllm-serve" / "launch.sh")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert "../tokenizer/tokenizer.json is missing: the servers read the tokenizer from there and download " \
           "nothing; rerun trtpd build --configs-only --force --tokenizer-dir" in out.stderr
    assert "tokenizer.json is missing" in (deploy_dir / "launch_triton.sh").read_text()


class WritesOutputs:
    """Each command 'succeeds' and leaves its files in --output_dir (test_execute.FakeRunner, minimally)."""

    def __init__(self, on_quantize=None):
        self.calls: list[list[str]] = []
        self.on_quantize = on_quantize

    def run(self, argv, env, log_path: Path, on_line) -> int:
        self.calls.append(argv)
        out = Path(argv[argv.index("--output_dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        if argv[0] == "python3" and argv[1].endswith("quantize.py"):
            tp = int(argv[argv.index("--tp_size") + 1])
            for rank in range(tp):
                save_file({"transformer.layers.0.attention.kv_cache_scaling_factor": np.array([0.5], np.float32)},
                          str(out / f"rank{rank}.safetensors"))
            if self.on_quantize:
                self.on_quantize()
                self.on_quantize = None
        else:
            (out / "rank0.bin").write_bytes(b"x")
        return 0


def test_a_real_build_without_a_local_tokenizer_is_refused_naming_the_fix(recipes, hub_cache, tmp_path):
    examples = tmp_path / "examples"
    (examples / "models/core/llama").mkdir(parents=True)
    (examples / "models/core/llama/convert_checkpoint.py").write_text("")
    prepared = prepare(make_request("llama-3.1-8b", recipes, BuildOverrides(fp8=False), engines_dir=tmp_path,
                                    examples_dir=str(examples)))
    runner = WritesOutputs()
    with pytest.raises(ConfigError, match=rf"tokenizer for {HUB_ID}: no tokenizer.json in the Hugging Face cache "
                                          rf"{hub_cache} \(entry models--meta-llama--Llama-3.1-8B\).*"
                                          rf"--tokenizer-dir .*hf download {HUB_ID} tokenizer.json"):
        run_build(prepared, report=lambda _: None, environment=BuildEnvironment("1.2.1", ["H100"] * 8),
                  runner=runner)
    assert runner.calls == []                   # convert_checkpoint.py fetches no tokenizer: refused before it runs
    assert not (tmp_path / "llama-3.1-8b").exists()


def test_an_fp8_build_copies_the_tokenizer_quantize_py_cached(recipes, hub_cache, tmp_path):
    """quantize.py loads the hub model's tokenizer (AutoTokenizer.from_pretrained), which fills the cache."""
    examples = tmp_path / "examples"
    (examples / "quantization").mkdir(parents=True)
    (examples / "quantization/quantize.py").write_text("")
    prepared = prepare(make_request("llama-3.1-8b", recipes, BuildOverrides(), engines_dir=tmp_path / "engines",
                                    examples_dir=str(examples)))
    runner = WritesOutputs(on_quantize=lambda: fake_hub_cache(hub_cache))
    run_build(prepared, report=lambda _: None, environment=BuildEnvironment("1.2.1", ["H100"] * 8), runner=runner)
    assert (tmp_path / "engines" / "llama-3.1-8b" / "deploy" / "tokenizer" / "tokenizer.json").is_file()


def test_write_deploy_keeps_an_old_folder_when_the_tokenizer_is_required_and_missing(request_for, hub_cache,
                                                                                       tmp_path):
    prepared = prepare(request_for("llama-3.1-8b", fp8=False, engines_dir=tmp_path))
    with pytest.raises(ConfigError, match="tokenizer for"):
        write_deploy(prepared.deploy, require_tokenizer=True)
    assert not (tmp_path / "llama-3.1-8b" / "deploy").exists()
