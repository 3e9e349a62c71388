"""The ensemble's wiring in the shared templates (the reference and the GPU repository render the same four):
every map names a tensor its model declares, each ensemble tensor has one data type from producer to consumers,
and postprocessing gets each streamed response's prefix from the entry model (trtpd/detokenize.py) through
optional inputs, so a response without it still reaches postprocessing (decoded alone, as before)."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2

from trtpd.repo.render import ModelPlan, render_repository
from trtpd.schema.pbtxt import load_model_config

COMMON = {"max_batch_size": 8, "instance_count": 1, "tokenizer_dir": "/t"}
SHARED_MODELS = [
    ModelPlan("preprocessing", "preprocessing", {**COMMON, "max_input_len": 64, "max_output_len": 16}),
    ModelPlan("postprocessing", "postprocessing", COMMON),
    ModelPlan("disagg_bls", "disagg_bls", {
        "max_batch_size": 8, "instance_count": 1, "mode": "disaggregated", "context_model_name": "prefill",
        "generation_model_name": "decode", "colocated_model_name": "none", "kv_transfer": "after_prefill",
        "perf_outputs": "", "kv_key_file": "", "fleet_file": ""}),
    ModelPlan("ensemble", "ensemble", {"max_batch_size": 8, "preprocessing_model": "preprocessing",
                                       "bls_model": "disagg_bls", "postprocessing_model": "postprocessing"}),
]


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, model_config_pb2.ModelConfig]:
    repo = render_repository(SHARED_MODELS, tmp_path_factory.mktemp("shared") / "repo")
    return {plan.name: load_model_config(repo / plan.name / "config.pbtxt") for plan in SHARED_MODELS}


def step_of(configs, model: str):
    [step] = [s for s in configs["ensemble"].ensemble_scheduling.step if s.model_name == model]
    return step


def test_every_map_names_a_declared_tensor_and_each_tensor_keeps_one_type(configs):
    ensemble = configs["ensemble"]
    types = {t.name: t.data_type for t in ensemble.input}
    for step in ensemble.ensemble_scheduling.step:
        model = configs[step.model_name]
        outputs = {t.name: t.data_type for t in model.output}
        for key, tensor in step.output_map.items():
            assert key in outputs, f"{step.model_name} declares no output {key}"
            assert types.setdefault(tensor, outputs[key]) == outputs[key], tensor
    for step in ensemble.ensemble_scheduling.step:
        inputs = {t.name: t.data_type for t in configs[step.model_name].input}
        for key, tensor in step.input_map.items():
            assert key in inputs, f"{step.model_name} declares no input {key}"
            assert types[tensor] == inputs[key], f"{tensor}: {types[tensor]}, {step.model_name}.{key}: {inputs[key]}"
    for output in ensemble.output:
        assert types[output.name] == output.data_type, output.name


def test_postprocessing_gets_the_prefix_and_the_final_flag_of_each_response_from_the_entry_model(configs):
    bls, post = step_of(configs, "disagg_bls"), step_of(configs, "postprocessing")
    inputs = {t.name: t for t in configs["postprocessing"].input}
    outputs = {t.name: t for t in configs["disagg_bls"].output}
    for name, data_type, dims in [("prefix_ids", model_config_pb2.TYPE_INT32, [-1]),
                                  ("is_final", model_config_pb2.TYPE_BOOL, [1])]:
        assert post.input_map[name] == bls.output_map[name], name
        assert inputs[name].optional, f"{name} must stay optional: an entry model may not send it"
        assert (inputs[name].data_type, list(inputs[name].dims)) == (data_type, dims)
        assert (outputs[name].data_type, list(outputs[name].dims)) == (data_type, dims)
