
import pytest

from trtpd.errors import ConfigError
from trtpd.lint import lint_repository
from trtpd.schema.pbtxt import load_model_config, parameters
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.repo.reference import render_reference_repository
from trtpd.repo.render import ModelPlan, render_repository


@pytest.mark.parametrize("mode, models", [
    ("disaggregated", {"ensemble", "preprocessing", "postprocessing", "disagg_bls", "prefill", "decode"}),
    ("colocated", {"ensemble", "preprocessing", "postprocessing", "disagg_bls", "colocated"}),
])
def test_rendered_configs_parse_as_model_config_and_lint_clean(fp16_root, tmp_path, mode, models):
    repo = render_reference_repository(ReferenceDeployment(fp16_root, mode=mode), tmp_path / "repo")
    assert {p.name for p in repo.iterdir() if p.is_dir()} == models
    for name in models:
        config = load_model_config(repo / name / "config.pbtxt")
        assert config.name == name and (repo / name / "1").is_dir()
    assert lint_repository(repo) == []
    assert (tmp_path / "repo.kv.key").stat().st_mode & 0o077 == 0
    if mode == "disaggregated":
        assert parameters(load_model_config(repo / "prefill" / "config.pbtxt"))["role"] == "prefill"
        bls = parameters(load_model_config(repo / "disagg_bls" / "config.pbtxt"))
        assert bls["context_model_name"] == "prefill" and bls["kv_transfer"] == "layerwise"


def test_incompatible_pair_is_refused_before_anything_is_written(fp16_root, fp8_root, tmp_path):
    spec = ReferenceDeployment(fp16_root, decode_engine=fp8_root / "decode-tp1")
    with pytest.raises(ConfigError, match=r"\[kv-dtype\]"):
        render_reference_repository(spec, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_missing_engine_names_the_build_command(tmp_path):
    with pytest.raises(ConfigError, match="trtpd build --backend reference"):
        render_reference_repository(ReferenceDeployment(tmp_path / "nothing"), tmp_path / "repo")


def test_a_failing_model_leaves_no_partial_repository(tmp_path, fp16_root):
    plans = [ModelPlan("postprocessing", "postprocessing", {"max_batch_size": 8, "tokenizer_dir": "/t",
                                                              "instance_count": 1}),
             ModelPlan("preprocessing", "preprocessing", {"max_batch_size": 8})]   # placeholders missing
    with pytest.raises(ConfigError, match="no value for placeholder"):
        render_repository(plans, tmp_path / "repo")
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(fp16_root, tmp_path):
    out = tmp_path / "repo"
    render_reference_repository(ReferenceDeployment(fp16_root), out)
    with pytest.raises(ConfigError, match="--force"):
        render_reference_repository(ReferenceDeployment(fp16_root), out)
    render_reference_repository(ReferenceDeployment(fp16_root, mode="colocated"), out, overwrite=True)
    assert (out / "colocated").is_dir() and not (out / "prefill").exists()
