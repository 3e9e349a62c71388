"""The GPU Triton repository: parses as ModelConfig, names equal folders, same tensor interface as
the reference role model (so one BLS drives both), and the MPI world arithmetic."""

from __future__ import annotations

import shutil

import pytest

from trtpd.trtllm.deploy import plan_deploy, plan_gpu_repository, write_deploy
from trtpd.trtllm.gpu_repo import plan_role_models
from trtpd.trtllm.mpi_world import plan_mpi_world
from trtpd.trtllm.plan import plan_build
from trtpd.errors import ConfigError
from trtpd.repo import template
from trtpd.schema.pbtxt import load_model_config, parameters, parse_model_config
from trtpd.repo.render import render_repository, templates_dir


@pytest.fixture(scope="module")
def repo(tmp_path_factory, recipes):
    from trtpd.trtllm.spec import BuildOverrides, make_request
    engines = tmp_path_factory.mktemp("engines")
    request = make_request("llama-2-70b", recipes, BuildOverrides(prefill_tp=2, decode_tp=4), engines_dir=engines)
    return write_deploy(plan_deploy(plan_build(request))) / "model_repository"


def test_every_config_parses_and_names_equal_folders(repo):
    folders = sorted(d.name for d in repo.iterdir())
    assert folders == ["decode", "disagg_bls", "ensemble", "postprocessing", "prefill", "preprocessing"]
    for folder in folders:
        config = load_model_config(repo / folder / "config.pbtxt")
        assert config.name == folder
        assert "${" not in (repo / folder / "config.pbtxt").read_text()


def test_role_models_are_tensorrtllm_with_the_disaggregation_settings(repo):
    for role, ranks, gpus in (("prefill", "1,2", "0,1"), ("decode", "3,4,5,6", "2,3,4,5")):
        config = load_model_config(repo / role / "config.pbtxt")
        params = parameters(config)
        assert config.backend == "tensorrtllm"
        assert config.model_transaction_policy.decoupled is True
        assert params["gpt_model_type"] == "inflight_fused_batching"
        assert params["gpt_model_path"].endswith(f"llama-2-70b/{role}-tp{len(ranks.split(','))}")
        assert params["participant_ids"] == ranks and params["gpu_device_ids"] == gpus
        assert params["max_beam_width"] == "1"
        assert (repo / role / "1").is_dir()
    assert parameters(load_model_config(repo / "prefill" / "config.pbtxt"))["enable_kv_cache_reuse"] == "false"
    assert parameters(load_model_config(repo / "decode" / "config.pbtxt"))["cuda_graph_mode"] == "true"
    bls = parameters(load_model_config(repo / "disagg_bls" / "config.pbtxt"))
    assert (bls["context_model_name"], bls["generation_model_name"]) == ("prefill", "decode")


def _render_any(name: str) -> dict:
    """A shared template rendered with placeholder values of '1': enough to read its tensors."""
    path = templates_dir() / name / "config.pbtxt.tmpl"
    text = path.read_text()
    values = {p: "1" for p in template.placeholders(text)}
    config = parse_model_config(template.render(text, values, source=str(path)), str(path))
    return {"inputs": {i.name: i.data_type for i in config.input}, "outputs": {o.name: o.data_type for o in config.output}}


def test_tensor_interface_covers_the_reference_role_model_and_the_bls(repo):
    trt = load_model_config(repo / "prefill" / "config.pbtxt")
    trt_inputs = {i.name: i.data_type for i in trt.input}
    trt_outputs = {o.name: o.data_type for o in trt.output}
    for name in ("reference", "disagg_bls"):
        for tensor, dtype in _render_any(name)["inputs"].items():
            assert trt_inputs.get(tensor) == dtype, f"{name} input {tensor} missing or retyped in tensorrtllm"
    for tensor in ("output_ids", "sequence_length", "context_phase_params"):
        assert trt_outputs[tensor] == _render_any("reference")["outputs"][tensor]
    required = [i.name for i in trt.input if not i.optional]
    assert required == ["input_ids", "input_lengths", "request_output_len"]


def test_mpi_world_arithmetic(request_for):
    for (ptp, dtp, dinst), world_size, decode_ids in (((4, 4, 1), 9, "5,6,7,8"), ((2, 4, 1), 7, "3,4,5,6"),
                                                      ((2, 2, 2), 7, "3,4;5,6")):
        world = plan_mpi_world(request_for(prefill_tp=ptp, decode_tp=dtp, decode_instances=dinst))
        assert world.world_size == world_size
        assert world.participant_ids("decode") == decode_ids


def test_data_parallel_instances_render_one_group_each(request_for, tmp_path):
    plan = plan_build(request_for(prefill_tp=2, decode_tp=2, decode_instances=2))
    models = plan_role_models(plan, plan_mpi_world(plan.request))
    out = render_repository(models, tmp_path / "repo")
    config = load_model_config(out / "decode" / "config.pbtxt")
    assert config.instance_group[0].count == 2
    assert parameters(config)["participant_ids"] == "3,4;5,6"
    assert parameters(config)["gpu_device_ids"] == "2,3;4,5"


def test_missing_shared_templates_are_named(request_for, tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(templates_dir() / "tensorrtllm", templates / "tensorrtllm")
    plan = plan_build(request_for(prefill_tp=4, decode_tp=4))
    world = plan_mpi_world(plan.request)
    with pytest.raises(ConfigError, match="lacks the shared template.*ensemble.*plan_role_models"):
        plan_gpu_repository(plan, world, "tok", templates)
    out = render_repository(plan_role_models(plan, world), tmp_path / "repo", templates=templates)
    assert sorted(d.name for d in out.iterdir()) == ["decode", "prefill"]


@pytest.mark.parametrize("overrides", [{}, {"decode_max_batch_size": 64, "max_output_len": 500}])
def test_decode_config_carries_the_plans_kv_cap_and_prefill_leaves_it_unset(overrides, request_for, tmp_path):
    """Decode gets the cap trtllm-serve gets as kv_cache_config.max_tokens. Prefill's key is there (one template
    serves both roles) and empty, which getKvCacheConfigFromParams reads as unset: its std::stoi throws on "" inside
    the try/catch that also covers an absent key (model_instance_state.cc@0c8de69, model_state.cc@5cdd692)."""
    from trtpd.lint.backend_parameters import BACKEND_PARAMETERS
    from trtpd.trtllm.serve_config import role_llm_options
    plan = plan_build(request_for(prefill_tp=2, decode_tp=4, **overrides))
    out = render_repository(plan_role_models(plan, plan_mpi_world(plan.request)), tmp_path / "repo")
    decode = parameters(load_model_config(out / "decode" / "config.pbtxt"))
    prefill = parameters(load_model_config(out / "prefill" / "config.pbtxt"))
    cap = plan.decode.spec.kv_cache_max_tokens
    assert cap == role_llm_options(plan, plan.decode)["kv_cache_config"]["max_tokens"]
    assert decode["max_tokens_in_paged_kv_cache"] == str(cap) and 0 < cap < 2**31      # int32: std::stoi
    assert decode["kv_cache_free_gpu_mem_fraction"] == "0.85"                           # both: the smaller pool
    assert plan.prefill.spec.kv_cache_max_tokens is None
    assert prefill["max_tokens_in_paged_kv_cache"] == ""
    assert {p.name: p.has_fallback for p in BACKEND_PARAMETERS}["max_tokens_in_paged_kv_cache"] is True


def test_a_kv_cap_the_backend_cannot_parse_is_refused(request_for):
    """Beyond int32, std::stoi throws out_of_range, the backend's catch drops the cap and only a log line says so."""
    from dataclasses import replace

    from trtpd.trtllm.gpu_repo import role_parameters
    plan = plan_build(request_for(prefill_tp=2, decode_tp=4))
    world = plan_mpi_world(plan.request)
    huge = replace(plan.decode, spec=replace(plan.decode.spec, kv_cache_max_tokens=2**31))
    with pytest.raises(ConfigError, match="max_tokens_in_paged_kv_cache must be <= 2147483647"):
        role_parameters(plan, huge, world)
    edge = replace(plan.decode, spec=replace(plan.decode.spec, kv_cache_max_tokens=2**31 - 1))
    assert role_parameters(plan, edge, world)["max_tokens_in_paged_kv_cache"] == "2147483647"
