from pathlib import Path

import pytest
import yaml

from trtpd.controller.spec import (DeploymentSpec, check_revision, changed_roles, diff_specs, load_spec,
                                   parse_spec)
from trtpd.errors import ConfigError
from trtpd.resources import configs_dir

REPO = Path(__file__).resolve().parents[3]

# line numbers: 1 api_version, 2 kind, 3 name, 4 model, 5 engines, 6 build_root, 7 roles, 8 prefill, 9 decode,
# 10 instances, 11 cpus_per_instance
BASE = """\
api_version: trtpd/v1
kind: Deployment
name: t
model: tiny-llama
engines:
  build_root: {root}
roles:
  prefill: {{instances: 1}}
  decode:
    instances: 1
    cpus_per_instance: 1
"""


def write(tmp_path: Path, text: str, name: str = "dep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_spec(path)
    return str(exc.value)


def spec(root: Path, tmp_path: Path, extra: str = "", name: str = "dep.yaml", decode_engine: Path | None = None,
         **roles) -> DeploymentSpec:
    text = BASE.format(root=root)
    if decode_engine is not None:
        text = text.replace(f"  build_root: {root}\n", f"  build_root: {root}\n  decode: {decode_engine}\n")
    for old, new in roles.items():
        text = text.replace(old, new)
    return load_spec(write(tmp_path, text + extra, name))


# -- the shipped examples -------------------------------------------------------------------------
def test_shipped_examples_load_with_paths_resolved_against_their_folder():
    disagg = load_spec(REPO / "configs/deployments/tiny-disagg.yaml")
    assert disagg.counts() == {"prefill": 1, "decode": 1}
    assert disagg.engines.build_root == (REPO / "engines/tiny-llama/reference-fp16").resolve()
    assert disagg.engine_dir("decode") == disagg.engines.build_root / "decode-tp1"
    assert (disagg.kv_transport, disagg.autoscaling.max, disagg.autoscaling.budget_cpus) == \
        ("shm", {"prefill": 2, "decode": 2}, 4)
    policy = disagg.routing_policy()
    assert (policy.balance, policy.decode_load, policy.tie_break, policy.max_prefill_attempts) == \
        ("least_loaded", "free_kv_blocks", "least_recent", 2)
    colocated = load_spec(REPO / "configs/deployments/tiny-colocated.yaml")
    assert colocated.counts() == {"colocated": 2}
    assert colocated.engine_dir("colocated").name == "colocated-tp1"
    worlds = load_spec(REPO / "configs/deployments/tiny-worlds.yaml")
    assert (worlds.worlds, worlds.kv_transport, worlds.unit_counts()) == (True, "mpi", {"world": 1})


def test_defaults_fill_every_optional_section(tmp_path):
    s = load_spec(write(tmp_path, BASE.format(root="engines")))
    assert s.engines.build_root == (tmp_path / "engines").resolve()
    assert (s.backend, s.mode, s.kv_transport, s.kv_transfer_timeout_ms) == ("reference", "disaggregated", "shm", 30000)
    assert (s.slo.ttft_s, s.slo.tpot_s, s.gateway.max_inflight, s.rollout.canary_share) == (2.0, 0.1, 64, 0.25)
    assert s.autoscaling.min == {"prefill": 1, "decode": 1} and s.autoscaling.max == {"prefill": 1, "decode": 1}
    assert (s.role("decode").tp, s.role("decode").max_batch_size, s.plan) == (1, 64, None)


# -- errors name the file, the line and the field -------------------------------------------------
def test_disaggregated_role_scaled_to_zero_is_refused_at_its_line(tmp_path):
    message = load_error(tmp_path, BASE.format(root="/x").replace("    instances: 1", "    instances: 0"))
    assert message.startswith(f"{tmp_path / 'dep.yaml'}:10: roles.decode.instances: "
                              "Input should be greater than or equal to 1")
    assert "zero" in message


def test_negative_instances_and_a_typo_are_refused_at_their_lines(tmp_path):
    message = load_error(tmp_path, BASE.format(root="/x").replace("{instances: 1}", "{instances: -1}")
                         .replace("cpus_per_instance", "cpu_per_instance"))
    lines = message.splitlines()
    assert f"{tmp_path / 'dep.yaml'}:8: roles.prefill.instances: Input should be greater than or equal to 0" in lines
    assert f"{tmp_path / 'dep.yaml'}:11: roles.decode.cpu_per_instance: Extra inputs are not permitted" in lines


def test_a_missing_field_names_the_line_of_its_parent(tmp_path):
    message = load_error(tmp_path, "# header\n" + BASE.format(root="/x").replace("model: tiny-llama\n", ""))
    assert message == f"{tmp_path / 'dep.yaml'}:2: model: Field required"
    message = load_error(tmp_path, BASE.format(root="/x").replace("    instances: 1\n    cpus_per_instance: 1\n", "")
                         .replace("  decode:\n", ""))
    assert message.startswith(f"{tmp_path / 'dep.yaml'}:7: roles.decode: mode disaggregated needs a roles.decode")


def test_itl_slo_keys_are_refused_with_what_to_write_instead(tmp_path):
    """Decode is judged by TPOT (one SLO type, trtpd/schema/slo.py): an ITL target is refused, naming its field."""
    message = load_error(tmp_path, BASE.format(root="/x") + "slo: {ttft_s: 2.0, itl_s: 0.2}\n")
    assert message.startswith(f"{tmp_path / 'dep.yaml'}:12: slo: Value error, itl_s: decode is judged by TPOT"), message
    message = load_error(tmp_path, BASE.format(root="/x") + "rollout: {max_itl_ratio: 2}\n")
    assert "rollout: Value error, max_itl_ratio: the gate judges decode by TPOT" in message, message
    spec = load_spec(write(tmp_path, BASE.format(root="/x") + "slo: {ttft_s: 0.5, tpot_s: 0.05, attainment: 0.99}\n"))
    assert (spec.slo.ttft_s, spec.slo.tpot_s, spec.slo.attainment) == (0.5, 0.05, 0.99)


def test_roles_must_match_the_mode(tmp_path):
    text = BASE.format(root="/x") + "mode: colocated\n"
    message = load_error(tmp_path, text)
    assert f"{tmp_path / 'dep.yaml'}:8: roles.prefill: mode colocated has no prefill role" in message
    assert f"{tmp_path / 'dep.yaml'}:9: roles.decode: mode colocated has no decode role" in message
    assert f"{tmp_path / 'dep.yaml'}:7: roles.colocated: mode colocated needs a roles.colocated entry" in message


def test_kv_transport_must_belong_to_the_backend(tmp_path):
    message = load_error(tmp_path, BASE.format(root="/x") + "kv_transport: nixl\n")
    assert message.startswith(f"{tmp_path / 'dep.yaml'}:12: kv_transport: 'nixl' is not a reference KV transport")
    message = load_error(tmp_path, BASE.format(root="/x") + "backend: tensorrt-llm\nkv_transport: nixl\n")
    assert message == (f"{tmp_path / 'dep.yaml'}:13: kv_transport: 'nixl' is not a tensorrt-llm KV transport; use "
                       f"one of mpi (Triton's tensorrtllm backend hard-codes CacheTransceiverConfig(MPI); UCX or NIXL "
                       f"need backend trtllm-serve)")
    assert load_spec(write(tmp_path, BASE.format(root="/x") + "backend: tensorrt-llm\n")).kv_transport == "mpi"
    assert load_spec(write(tmp_path, BASE.format(root="/x") + "backend: trtllm-serve\n")).kv_transport == "ucx"


def test_autoscaling_budget_and_bounds(tmp_path):
    scaling = ("autoscaling:\n  enabled: true\n  min: {prefill: 1, decode: 1}\n  max: {prefill: 2, decode: 3}\n"
               "  budget_cpus: 3\n")
    text = BASE.format(root="/x").replace("cpus_per_instance: 1", "cpus_per_instance: 3") + scaling
    message = load_error(tmp_path, text)
    assert message == (f"{tmp_path / 'dep.yaml'}:16: autoscaling.budget_cpus: the roles need 4 (prefill 1x1 + "
                       f"decode 1x3), more than budget_cpus 3")
    text = BASE.format(root="/x").replace("    instances: 1", "    instances: 4") + scaling.replace("3\n", "9\n")
    message = load_error(tmp_path, text)
    assert message == (f"{tmp_path / 'dep.yaml'}:10: roles.decode.instances: 4 is outside the autoscaling bounds "
                       f"[1, 3] for decode")
    message = load_error(tmp_path, BASE.format(root="/x") + "autoscaling:\n  min: {decode: 0, colocated: 1}\n")
    assert f"{tmp_path / 'dep.yaml'}:13: autoscaling.min.colocated: mode disaggregated has no colocated role" in message
    assert f"{tmp_path / 'dep.yaml'}:13: autoscaling.min.decode: Input should be greater than or equal to 1" in message
    # disabled: the budget is not checked
    assert load_spec(write(tmp_path, text.replace("enabled: true", "enabled: false"))).counts()["decode"] == 4


def test_yaml_syntax_errors_and_duplicate_keys_name_the_line(tmp_path):
    message = load_error(tmp_path, BASE.format(root="/x").replace("  prefill: {instances: 1}", "  prefill: {instances: 1"))
    assert message.startswith(f"{tmp_path / 'dep.yaml'}:9: not valid YAML")
    message = load_error(tmp_path, BASE.format(root="/x") + "model: other\n")
    assert message == f"{tmp_path / 'dep.yaml'}:12: model: duplicate key (first at line 4); keep one"


def test_parse_spec_names_the_source_it_is_given():
    with pytest.raises(ConfigError, match=r"^from-stdin:3: name: String should match pattern"):
        parse_spec(BASE.format(root="/x").replace("name: t", "name: ../t"), "from-stdin", base_dir=Path("/"))


# -- the plan ---------------------------------------------------------------------------------------
def small_plan(tmp_path: Path, decode_tp: int = 1) -> Path:
    data = yaml.safe_load((configs_dir("plans") / "example-llama-2-70b-h100-chat-40rps.yaml").read_text())
    data["prefill"].update(num_instances=3, tp=1)
    data["decode"].update(num_instances=2, tp=decode_tp)
    path = tmp_path / "plans" / "small.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_counts_and_tp_come_from_the_plan(tmp_path):
    small_plan(tmp_path)
    text = BASE.format(root="/x").replace("{instances: 1}", "{}").replace("    instances: 1\n", "")
    s = load_spec(write(tmp_path, text + "plan: plans/small.yaml\n"))
    assert s.plan == (tmp_path / "plans" / "small.yaml").resolve()
    assert s.counts() == {"prefill": 3, "decode": 2}
    again = DeploymentSpec.from_json(s.spec_json())
    assert again == s
    (tmp_path / "plans" / "small.yaml").write_text("not: a plan\n")     # a stored revision keeps its counts
    assert DeploymentSpec.from_json(s.spec_json()).counts() == {"prefill": 3, "decode": 2}


def test_instances_that_contradict_the_plan_name_both(tmp_path):
    plan = small_plan(tmp_path)
    message = load_error(tmp_path, BASE.format(root="/x").replace("{instances: 1}", "{}") + "plan: plans/small.yaml\n")
    assert message.startswith(f"{tmp_path / 'dep.yaml'}:10: roles.decode.instances: 1 differs from 2, the plan "
                              f"{plan.resolve()}'s decode.num_instances")


def test_a_plan_with_tp_2_needs_the_gpu_backend(tmp_path):
    small_plan(tmp_path, decode_tp=2)
    text = BASE.format(root="/x").replace("{instances: 1}", "{}").replace("    instances: 1\n", "")
    message = load_error(tmp_path, text + "plan: plans/small.yaml\n")
    assert message.startswith(f"{tmp_path / 'dep.yaml'}:9: roles.decode.tp: the reference backend runs the "
                              "reference engines here, tp 1 only; got 2 (from the plan")
    message = load_error(tmp_path, text + "plan: plans/small.yaml\nbackend: tensorrt-llm\n")
    assert message.endswith("use a plan with tp 1 (a gpus section runs it on this machine's GPUs)"), message
    worlds = text + "plan: plans/small.yaml\nbackend: tensorrt-llm\ngpus: {devices: [0, 1, 2, 3, 4, 5]}\n"
    message = load_error(tmp_path, worlds)
    assert message.endswith("gpus.devices: the first world does not fit: 7 GPUs needed (prefill 3x1 + decode 2x2) but "
                            "the inventory gpus.devices has 6 ([0, 1, 2, 3, 4, 5]); add devices, or run fewer "
                            "instances or a smaller tp"), message
    s = load_spec(write(tmp_path, worlds.replace("5]", "5, 6]")))
    assert (s.role("decode").tp, s.gpus_per_instance("decode"), s.engine_dir("decode").name) == (2, 2, "decode-tp2")
    assert s.world_gpus(s.counts()) == 7 and s.serve_dir() == s.engines.build_root / "deploy"
    message = load_error(tmp_path, text + "plan: plans/missing.yaml\n")
    assert message.startswith(f"{tmp_path / 'dep.yaml'}:11: plan: {(tmp_path / 'plans/missing.yaml').resolve()}: "
                              "no such file")


# -- shapes, diffs, KV compatibility ----------------------------------------------------------------
def test_role_shapes_read_the_engines(fp16_root, fp8_root, tmp_path):
    s = spec(fp16_root, tmp_path)
    shapes = s.role_shapes()
    assert set(shapes) == {"prefill", "decode"}
    assert shapes["decode"].engine_dir == str((fp16_root / "decode-tp1").resolve())
    assert shapes["prefill"].kv_signature == shapes["decode"].kv_signature
    assert (shapes["decode"].cpus_per_instance, shapes["decode"].kv_transport, shapes["decode"].tp) == (1, "shm", 1)
    assert spec(fp16_root, tmp_path, name="again.yaml").role_shapes() == shapes     # stable
    fp8 = spec(fp8_root, tmp_path, name="fp8.yaml").role_shapes()
    assert fp8["decode"].kv_signature != shapes["decode"].kv_signature
    slower = spec(fp16_root, tmp_path, "  decode: {instances: 1, step_delay_ms: 50}\n", name="slow.yaml",
                  **{"  decode:\n    instances: 1\n    cpus_per_instance: 1\n": ""}).role_shapes()
    assert slower["decode"].config_hash != shapes["decode"].config_hash
    assert slower["prefill"].config_hash == shapes["prefill"].config_hash
    with pytest.raises(ConfigError, match=str(tmp_path / "nowhere" / "prefill-tp1")):
        spec(tmp_path / "nowhere", tmp_path, name="none.yaml").role_shapes()


def test_diff_effects(fp16_root, fp8_root, tmp_path):
    old = spec(fp16_root, tmp_path, name="old.yaml")
    new = spec(fp16_root, tmp_path, "routing: {balance: round_robin}\ngateway: {port: 8123, max_inflight: 8}\n",
               name="new.yaml", **{"    instances: 1": "    instances: 3", "{instances: 1}": "{cpus_per_instance: 2}"})
    effects = {(c.field, c.effect) for c in diff_specs(old, new)}
    assert effects == {("roles.decode.instances", "scale:decode"), ("roles.prefill.cpus_per_instance", "restart:prefill"),
                       ("autoscaling.max.decode", "in_place"), ("routing.balance", "in_place"),
                       ("gateway.port", "restart:gateway"), ("gateway.max_inflight", "in_place")}
    assert changed_roles(old, new) == ("prefill",)
    moved = spec(fp16_root, tmp_path, name="moved.yaml", decode_engine=fp8_root / "decode-tp1",
                 **{"engines:\n": "kv_transport: tcp\nengines:\n"})
    changes = diff_specs(old, moved)
    assert {(c.field, c.effect) for c in changes} == {
        ("kv_transport", "restart:prefill"), ("kv_transport", "restart:decode"), ("engines.decode", "restart:decode")}
    assert [c.new for c in changes if c.field == "engines.decode"] == [str(fp8_root / "decode-tp1")]
    assert diff_specs(old, spec(fp16_root, tmp_path, name="same.yaml")) == []


def test_round_trip_to_yaml(fp16_root, tmp_path):
    s = spec(fp16_root, tmp_path, "slo: {ttft_s: 1.0}\n")
    again = parse_spec(s.to_yaml(), "round-trip.yaml")
    assert again == s and again.spec_json() == s.spec_json()
    assert again.to_yaml().startswith("# trtpd deployment spec")


def test_reference_deployment(fp16_root, fp8_root, tmp_path):
    s = spec(fp16_root, tmp_path, decode_engine=fp8_root / "decode-tp1",
             **{"    instances: 1": "    instances: 2\n    max_batch_size: 16"})
    dep = s.reference_deployment()
    assert (dep.build_root, dep.mode, dep.prefill_instances, dep.decode_instances, dep.max_batch_size) == \
        (fp16_root.resolve(), "disaggregated", 1, 2, 64)
    assert dep.decode_engine == (fp8_root / "decode-tp1").resolve()
    override = s.reference_deployment({"prefill": fp8_root / "prefill-tp1"})
    assert override.prefill_engine == (fp8_root / "prefill-tp1").resolve()


def test_check_revision_finds_kv_dtype_mismatches(fp16_root, fp8_root, tmp_path):
    old = spec(fp16_root, tmp_path, name="old.yaml")
    assert check_revision(old, None, revision=1) == []
    mixed = spec(fp16_root, tmp_path, name="mixed.yaml", decode_engine=fp8_root / "decode-tp1")
    problems = check_revision(mixed, old, revision=2, old_revision=1)
    assert len(problems) == 2
    within, rollout = problems
    assert within.startswith("revision 2: prefill vs decode: [kv-dtype] KV dtype differs: prefill fp16, decode fp8")
    assert rollout.startswith("revision 2 changes decode and keeps prefill of revision 1: during the rollout decode "
                              "(revision 2) and prefill (revision 1) exchange KV: [kv-dtype]")
    assert "fp16" in rollout and "fp8" in rollout
    all_fp8 = spec(fp8_root, tmp_path, name="fp8.yaml")
    assert check_revision(all_fp8, old, revision=3, old_revision=1) == []   # both roles change together
    renamed = spec(fp16_root, tmp_path, name="renamed.yaml", **{"name: t": "name: u"})
    assert check_revision(renamed, old, revision=4, old_revision=1) == [
        "revision 4: name 'u' differs from revision 1's 't'; a revision cannot rename a deployment "
        "(apply it as a new deployment)"]
    missing = check_revision(spec(tmp_path / "nowhere", tmp_path, name="none.yaml"), old, revision=5)
    assert len(missing) == 2 and all(str(tmp_path / "nowhere") in p for p in missing)


def test_an_engine_rebuilt_in_place_restarts_its_role_against_the_recorded_shapes(fp16_root, tmp_path):
    import json
    import shutil

    root = tmp_path / "engines"
    shutil.copytree(fp16_root, root)
    s = spec(root, tmp_path)
    recorded = s.role_shapes()
    config = root / "decode-tp1" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "bucket_timeout_ms": 9.0}))
    assert diff_specs(s, s) == []                      # the specs alone cannot see it
    changes = diff_specs(s, s, old_shapes=recorded)
    assert [(c.field, c.effect) for c in changes] == [("engines.decode.content", "restart:decode")]
    assert changed_roles(s, s, old_shapes=recorded) == ("decode",)
    assert changed_roles(s, s) == ()


def test_a_trtllm_serve_spec_runs_the_twin_on_cpus(tmp_path, fp16_root):
    """backend: trtllm-serve: its KV transports are cache_transceiver_config's backends (ucx by default), its role
    shapes say what the executor starts, and like the reference backend it runs tp 1 on CPUs here."""
    text = BASE.format(root=fp16_root)
    s = load_spec(write(tmp_path, text + "backend: trtllm-serve\n"))
    assert s.kv_transport == "ucx"
    assert {r: shape.backend for r, shape in s.role_shapes().items()} == {"prefill": "trtllm-serve",
                                                                          "decode": "trtllm-serve"}
    message = load_error(tmp_path, text + "backend: trtllm-serve\nkv_transport: shm\n")
    assert "'shm' is not a trtllm-serve KV transport; use one of default, ucx, nixl, mpi" in message
    message = load_error(tmp_path, text.replace("    cpus_per_instance: 1\n", "    gpus_per_instance: 2\n")
                         + "backend: trtllm-serve\n")
    assert "roles.decode.gpus_per_instance: the trtllm-serve backend runs on CPUs here" in message
