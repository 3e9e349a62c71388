"""Running a plan with a fake of the subprocess: manifests, checksums, skips, failures, logs.

The real commands need TensorRT-LLM 1.2.x and GPUs; FakeRunner writes what they would write."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from trtpd.trtllm.environment import BuildEnvironment, TrtllmUnavailableError, require_runnable
from trtpd.trtllm.execute import BuildStepError, execute_plan
from trtpd.trtllm.kv_scales import KvScalesError, read_kv_scales
from trtpd.schema.manifest import load_manifest
from trtpd.trtllm.plan import plan_build
from trtpd.trtllm.run import prepare, run_build
from trtpd.trtllm.spec import BuildOverrides, make_request
from trtpd.errors import ConfigError


def write_rank_files(out: Path, world: int, scales: list[float]) -> None:
    """What quantize.py --kv_cache_dtype fp8 writes, for the KV scales: one F32 scalar per layer and rank (every
    rank of a TP group the same), beside FP8 weights that the scale reader must skip."""
    for rank in range(world):
        tensors = {"transformer.vocab_embedding.weight": np.zeros((4, 2), dtype=np.float16)}
        for layer, scale in enumerate(scales):
            prefix = f"transformer.layers.{layer}.attention."
            tensors[prefix + "qkv.weight"] = np.zeros((4, 2), dtype=np.uint8)
            tensors[prefix + "kv_cache_scaling_factor"] = np.array([scale], dtype=np.float32)
        save_file(tensors, str(out / f"rank{rank}.safetensors"))


class FakeRunner:
    """Writes what each command would write. quantize.py writes rank files with KV scales: `scales` maps a part of
    the output folder's name to that checkpoint's per-layer scales (default: the same for every checkpoint, as two
    deterministic calibrations of one model give)."""

    DEFAULT_SCALES = [0.0125, 0.015, 0.0175, 0.02]

    def __init__(self, fail_on: str | None = None, scales: dict[str, list[float]] | None = None):
        self.calls: list[list[str]] = []
        self.fail_on = fail_on
        self.scales = scales or {}

    def run(self, argv, env, log_path: Path, on_line) -> int:
        self.calls.append(argv)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"$ {' '.join(argv)}\n")
        out = Path(argv[argv.index("--output_dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        on_line(f"working on {out.name}")
        if argv[0] == "trtllm-build":
            (out / "config.json").write_text(json.dumps({"argv": argv}))
            (out / "rank0.engine").write_bytes(b"engine-bytes")
        elif argv[1].endswith("quantize.py"):
            (out / "config.json").write_text("{}")
            world = int(argv[argv.index("--tp_size") + 1]) * int(argv[argv.index("--pp_size") + 1])
            scales = next((v for k, v in self.scales.items() if k in out.name), self.DEFAULT_SCALES)
            write_rank_files(out, world, scales)
        else:
            (out / "config.json").write_text("{}")
            (out / "rank0.safetensors").write_bytes(b"weights")
        if self.fail_on and self.fail_on in " ".join(argv):
            (out / "partial.bin").write_bytes(b"half")
            return 3
        return 0


VERSIONS = {"tensorrt_llm_installed": "1.2.1"}


@pytest.fixture
def plan(request_for, tmp_path):
    return plan_build(request_for(prefill_tp=2, decode_tp=4, engines_dir=tmp_path))


def test_successful_build_writes_complete_manifests(plan, tmp_path):
    lines: list[str] = []
    manifests = execute_plan(plan, FakeRunner(), lines.append, versions=VERSIONS)
    assert [m.status for m in manifests] == ["complete", "complete"]
    m = load_manifest(plan.decode.engine_dir)
    assert m.status == "complete" and m.updated_at
    assert [c.path for c in m.checksums] == ["config.json", "rank0.engine"]
    assert [s.status for s in m.steps] == ["ok", "ok"]
    assert m.steps[1].log_path.endswith("logs/trtllm-build-decode-tp4.log") and Path(m.steps[1].log_path).is_file()
    assert m.versions["tensorrt_llm_installed"] == "1.2.1" and m.versions["tensorrt_llm"] == "1.2.1"
    assert any(line.startswith("running trtllm-build: trtllm-build --checkpoint_dir") for line in lines)
    assert any("[quantize] working on fp8-tp2" in line for line in lines)


def test_second_run_skips_what_is_up_to_date(plan):
    execute_plan(plan, FakeRunner(), lambda _: None, versions=VERSIONS)
    runner, lines = FakeRunner(), []
    execute_plan(plan, runner, lines.append, versions=VERSIONS)
    assert runner.calls == []
    assert sum("up to date" in line for line in lines) == 2


def test_changed_engine_file_is_rebuilt_but_checkpoint_is_not(plan):
    execute_plan(plan, FakeRunner(), lambda _: None, versions=VERSIONS)
    (plan.decode.engine_dir / "rank0.engine").write_bytes(b"tampered")
    runner = FakeRunner()
    execute_plan(plan, runner, lambda _: None, versions=VERSIONS)
    assert [c[0] for c in runner.calls] == ["trtllm-build"]
    assert load_manifest(plan.decode.engine_dir).steps[0].status == "skipped"


def test_shared_checkpoint_is_converted_once(request_for, tmp_path):
    plan = plan_build(request_for(prefill_tp=4, decode_tp=4, engines_dir=tmp_path))
    runner = FakeRunner()
    execute_plan(plan, runner, lambda _: None, versions=VERSIONS)
    assert [Path(c[1]).name if c[0] == "python3" else c[0] for c in runner.calls] == \
        ["quantize.py", "trtllm-build", "trtllm-build"]


def test_failed_step_leaves_a_failed_manifest_and_no_partial_engine(plan):
    with pytest.raises(BuildStepError, match=r"trtllm-build failed with exit code 3 .*see .*trtllm-build-decode-tp4.log"):
        execute_plan(plan, FakeRunner(fail_on="decode-tp4"), lambda _: None, versions=VERSIONS)
    assert sorted(p.name for p in plan.decode.engine_dir.iterdir()) == ["manifest.json"]
    m = load_manifest(plan.decode.engine_dir)
    assert m.status == "failed" and "exit code 3" in m.error
    assert [s.status for s in m.steps] == ["ok", "failed"]
    assert load_manifest(plan.prefill.engine_dir).status == "complete"


def test_failed_checkpoint_is_removed(plan):
    with pytest.raises(BuildStepError):
        execute_plan(plan, FakeRunner(fail_on="fp8-tp2"), lambda _: None, versions=VERSIONS)
    assert not any(plan.prefill.checkpoint_step.output_dir.iterdir())
    assert load_manifest(plan.prefill.engine_dir).status == "failed"


def test_missing_tensorrt_llm_points_to_dry_run(request_for, tmp_path):
    prepared = prepare(request_for(prefill_tp=4, decode_tp=4, engines_dir=tmp_path))
    with pytest.raises(TrtllmUnavailableError, match=r"tensorrt_llm is not importable.*--dry-run.*--configs-only"):
        run_build(prepared, report=lambda _: None, environment=BuildEnvironment(None, []), runner=FakeRunner())
    assert list(tmp_path.iterdir()) == []


def test_wrong_version_and_missing_gpus_are_refused():
    with pytest.raises(TrtllmUnavailableError, match="tensorrt_llm 1.3.0 is installed.*pinned to 1.2.1"):
        require_runnable(BuildEnvironment("1.3.0", ["H100"] * 8), 4)
    with pytest.raises(TrtllmUnavailableError, match="needs 4 GPU"):
        require_runnable(BuildEnvironment("1.2.1", ["H100"]), 4)
    require_runnable(BuildEnvironment("1.2.1", ["H100"] * 4), 4)        # more cases: test_environment.py


def _examples(root: Path) -> str:
    """A stand-in for the container's TensorRT-LLM examples folder."""
    for script in ("quantization/quantize.py", "models/core/llama/convert_checkpoint.py"):
        (root / script).parent.mkdir(parents=True, exist_ok=True)
        (root / script).write_text("")
    return str(root)


def test_run_build_writes_engines_and_deploy(request_for, tmp_path, recipes):
    request = make_request("llama-2-70b", recipes, BuildOverrides(prefill_tp=2, decode_tp=4), engines_dir=tmp_path,
                           examples_dir=_examples(tmp_path / "examples"))
    tokenizer = tmp_path / "checkpoint"                           # (test_tokenizer_files.py: from the hub cache)
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    prepared = prepare(request, tokenizer_dir=str(tokenizer))
    manifests = run_build(prepared, report=lambda _: None, environment=BuildEnvironment("1.2.1", ["H100"] * 8),
                          runner=FakeRunner())
    assert [m.status for m in manifests] == ["complete", "complete"]
    deploy = tmp_path / "llama-2-70b" / "deploy"
    assert (deploy / "launch_triton.sh").stat().st_mode & 0o111
    assert (deploy / "model_repository" / "decode" / "config.pbtxt").is_file()
    assert (deploy / "python" / "trtpd" / "serving" / "bls_model.py").is_file()
    assert not list((deploy / "python").rglob("__pycache__"))
    assert (deploy / "tokenizer" / "tokenizer.json").read_text() == "{}"


def test_run_build_refuses_missing_examples_before_running_anything(request_for, tmp_path):
    prepared = prepare(request_for(prefill_tp=2, decode_tp=4, engines_dir=tmp_path))
    runner = FakeRunner()
    with pytest.raises(ConfigError, match=r"/app/examples/quantization/quantize.py missing.*--container trtllm-1.2.1"):
        run_build(prepared, report=lambda _: None, environment=BuildEnvironment("1.2.1", ["H100"] * 8), runner=runner)
    assert not (tmp_path / "llama-2-70b").exists()


def test_fp8_pair_records_the_kv_scales_digest_read_from_both_checkpoints(plan):
    runner = FakeRunner()
    execute_plan(plan, runner, lambda _: None, versions=VERSIONS)
    prefill, decode = load_manifest(plan.prefill.engine_dir), load_manifest(plan.decode.engine_dir)
    assert prefill.kv_scales_digest and prefill.kv_scales_digest == decode.kv_scales_digest
    assert prefill.kv_scales_digest == read_kv_scales(plan.decode.checkpoint_step.output_dir, 4).digest
    # both calibrations run before the first engine, so a disagreement stops the build before any trtllm-build
    assert [Path(c[1]).name if c[0] == "python3" else c[0] for c in runner.calls] == \
        ["quantize.py", "quantize.py", "trtllm-build", "trtllm-build"]


def test_pair_whose_two_calibrations_disagree_is_refused_before_any_engine(plan):
    runner = FakeRunner(scales={"fp8-tp4": [0.0125, 0.015, 0.018, 0.02]})
    with pytest.raises(KvScalesError, match=r"kv_scales_digest differs: prefill checkpoint .*fp8-tp2 has [0-9a-f]{16}, "
                                            r"decode checkpoint .*fp8-tp4 has [0-9a-f]{16} \(first difference at "
                                            r"layer 2: .*\)"):
        execute_plan(plan, runner, lambda _: None, versions=VERSIONS)
    assert [c[0] for c in runner.calls] == ["python3", "python3"]           # no engine was built
    for role in plan.roles:
        m = load_manifest(role.engine_dir)
        assert m.status == "failed" and "kv_scales_digest differs" in m.error
        assert sorted(p.name for p in role.engine_dir.iterdir()) == ["manifest.json"]


def test_rebuilding_one_role_compares_against_the_other_roles_checkpoint(plan):
    execute_plan(plan, FakeRunner(), lambda _: None, versions=VERSIONS)
    (plan.decode.engine_dir / "rank0.engine").write_bytes(b"tampered")
    for rank in plan.decode.checkpoint_step.output_dir.glob("rank*.safetensors"):
        rank.unlink()                                     # decode's checkpoint re-quantizes, with other scales
    (plan.decode.checkpoint_step.output_dir / "trtpd-step.json").unlink()
    with pytest.raises(KvScalesError, match="kv_scales_digest differs"):
        execute_plan(plan, FakeRunner(scales={"fp8-tp4": [1.0, 1.0, 1.0, 1.0]}), lambda _: None, versions=VERSIONS)
    assert load_manifest(plan.prefill.engine_dir).status == "complete"   # the good engine is left as it was


def test_fp16_pair_has_no_kv_scales_digest(request_for, tmp_path):
    plan = plan_build(request_for("llama-3.1-8b", prefill_tp=1, decode_tp=1, fp8=False, engines_dir=tmp_path))
    manifests = execute_plan(plan, FakeRunner(), lambda _: None, versions=VERSIONS)
    assert [m.kv_scales_digest for m in manifests] == [None, None]
