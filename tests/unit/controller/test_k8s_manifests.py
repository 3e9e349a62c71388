"""render_manifests: every object validates against Kubernetes 1.30's schema (strict), and says what the
trtllm-serve path's launch.sh says (command, options YAML), with the key, probes and drain settings."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trtpd.trtllm.mpi_world import plan_mpi_world
from trtpd.trtllm.plan import plan_build
from trtpd.trtllm.recipe import load_recipes
from trtpd.trtllm.serve_config import ServeLayout, render_serve_files, worker_commands
from trtpd.trtllm.spec import BuildOverrides, make_request
from trtpd.controller.k8s.manifests import (SHUTDOWN_S, EnginesVolume, drain_seconds, dump_yaml, render_manifests,
                                            validate_manifests)
from trtpd.controller.types import RoleShape
from trtpd.errors import ConfigError

KEY = bytes(range(32))
MODEL = "/engines/llama-2-70b/hf"


@pytest.fixture(scope="module")
def plan():
    request = make_request("llama-2-70b", load_recipes(), BuildOverrides(prefill_tp=2, decode_tp=4),
                           engines_dir=Path("/engines"))
    return plan_build(request)


def shape(plan, role: str, **kw) -> RoleShape:
    rp = plan.prefill if role == "prefill" else plan.decode
    return RoleShape(role, str(rp.engine_dir), f"hash-{role}", "fp8/80/8/128/32",
                     gpus_per_instance=rp.spec.gpus_per_instance, tp=rp.spec.tp_size, **kw)


def render(plan, roles: dict[str, int], **kw) -> list[dict]:
    kw.setdefault("engines", EnginesVolume(pvc_name="trtpd-engines"))
    return render_manifests("llama", 1, {r: shape(plan, r) for r in roles}, roles, plan=plan, model_path=MODEL,
                            kv_key=KEY, gateway_image="registry.example/trtpd:0.1.0", **kw)


def by_name(manifests: list[dict]) -> dict[tuple[str, str], dict]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def test_disaggregated_manifests_validate_strictly(plan):
    manifests = render(plan, {"prefill": 1, "decode": 2})
    assert validate_manifests(manifests, "1.30") == []
    assert sorted(by_name(manifests)) == sorted([
        ("Secret", "llama-kv-key"), ("Secret", "llama-api-key"), ("ConfigMap", "llama-fleet"),
        ("ConfigMap", "llama-prefill-r1-serve"), ("Deployment", "llama-prefill-r1"), ("Service", "llama-prefill"),
        ("ConfigMap", "llama-decode-r1-serve"), ("Deployment", "llama-decode-r1"), ("Service", "llama-decode"),
        ("Deployment", "llama-gateway"), ("Service", "llama-gateway"), ("NetworkPolicy", "llama-instances")])


def test_colocated_manifests_validate_strictly(plan):
    manifests = render(plan, {"colocated": 3}, engines=EnginesVolume(host_path="/srv/engines"))
    assert validate_manifests(manifests, "1.30") == []
    objects = by_name(manifests)
    options = yaml.safe_load(objects[("ConfigMap", "llama-colocated-r1-serve")]["data"]["colocated.yaml"])
    assert "cache_transceiver_config" not in options          # one server serves whole requests
    assert '"mode": "colocated"' in objects[("ConfigMap", "llama-fleet")]["data"]["fleet.json"]
    assert objects[("Deployment", "llama-colocated-r1")]["spec"]["replicas"] == 3
    volume = objects[("Deployment", "llama-colocated-r1")]["spec"]["template"]["spec"]["volumes"][0]
    assert volume == {"name": "engines", "hostPath": {"path": "/srv/engines", "type": "Directory"}}


def test_a_typo_and_a_wrong_type_are_reported(plan):
    manifests = render(plan, {"prefill": 1, "decode": 1})
    deployment = by_name(manifests)[("Deployment", "llama-decode-r1")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbe"] = container.pop("livenessProbe")
    by_name(manifests)[("Service", "llama-decode")]["spec"]["ports"][0]["port"] = "eight thousand"
    problems = validate_manifests(manifests, "1.30")
    assert len(problems) == 2, problems
    assert any("Deployment llama-decode-r1" in p and "livenesProbe" in p for p in problems), problems
    assert any("Service llama-decode: spec.ports.0.port" in p for p in problems), problems


def test_role_pods_run_the_trtllm_serve_command_and_options_of_the_plan(plan):
    objects = by_name(render(plan, {"prefill": 1, "decode": 2}))
    world = plan_mpi_world(plan.request)
    for role, rp in (("prefill", plan.prefill), ("decode", plan.decode)):
        pod = objects[("Deployment", f"llama-{role}-r1")]["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        expected = next(w for w in worker_commands(plan, world, ServeLayout(), "/etc/trtpd/serve") if w.role == role)
        flags = dict(zip(container["command"][2::2], container["command"][3::2]))
        assert container["command"][:2] == ["trtllm-serve", str(rp.engine_dir)]
        assert flags == {**dict(expected.args), "--host": "0.0.0.0", "--port": "8000", "--tokenizer": MODEL}
        assert container["resources"]["limits"] == {"nvidia.com/gpu": str(rp.spec.gpus_per_instance)}
        config = objects[("ConfigMap", f"llama-{role}-r1-serve")]["data"][f"{role}.yaml"]
        assert config == render_serve_files(plan, world, ServeLayout(), "x")[f"x/{role}.yaml"]
        assert pod["metadata"]["labels"] == {"app.kubernetes.io/name": "trtpd", "app.kubernetes.io/instance": "llama",
                                             "app.kubernetes.io/component": "instance", "trtpd.dev/role": role,
                                             "trtpd.dev/revision": "1"}


def test_probes_drain_and_key(plan):
    objects = by_name(render(plan, {"prefill": 1, "decode": 1}))
    spec = objects[("Deployment", "llama-prefill-r1")]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 900
    hold_s = drain_seconds(plan)
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(hold_s)]
    assert spec["terminationGracePeriodSeconds"] == hold_s + SHUTDOWN_S
    key_volume = next(v for v in spec["volumes"] if v["name"] == "kv-key")
    assert key_volume["secret"] == {"secretName": "llama-kv-key", "defaultMode": 0o400}
    assert {"name": "kv-key", "mountPath": "/etc/trtpd/kv", "readOnly": True} in container["volumeMounts"]
    secret = objects[("Secret", "llama-kv-key")]
    assert base64.b64decode(secret["data"]["key"]).decode() == KEY.hex() + "\n"   # handle.py's key file format
    policy = objects[("NetworkPolicy", "llama-instances")]["spec"]
    assert policy["ingress"] == [{"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "trtpd",
                                                                            "app.kubernetes.io/instance": "llama"}}}]}]
    gateway = objects[("Deployment", "llama-gateway")]["spec"]["template"]["spec"]["containers"][0]
    assert gateway["command"][:3] == ["python", "-m", "trtpd.gateway"]
    assert objects[("Service", "llama-gateway")]["spec"]["type"] == "ClusterIP"
    assert objects[("Service", "llama-decode")]["spec"]["clusterIP"] == "None"


def test_dump_yaml_is_multi_document_without_anchors(plan):
    manifests = render(plan, {"prefill": 1, "decode": 1})
    text = dump_yaml(manifests)
    assert "&id" not in text and "*id" not in text
    assert list(yaml.safe_load_all(text)) == manifests


@pytest.mark.parametrize("change, fault", [
    ({"name": "Llama_2"}, "deployment name"),
    ({"engines": EnginesVolume(pvc_name="a", host_path="/b")}, "exactly one of pvc_name"),
    ({"engines": EnginesVolume(mount_path="/models", pvc_name="a")}, "not under the engines mount"),
])
def test_bad_input_names_the_field(plan, change, fault):
    kw = dict(plan=plan, model_path=MODEL, engines=EnginesVolume(pvc_name="e"), kv_key=KEY, gateway_image="g")
    kw.update({k: v for k, v in change.items() if k != "name"})
    with pytest.raises(ConfigError, match=fault):
        render_manifests(change.get("name", "llama"), 1, {"decode": shape(plan, "decode")}, {"decode": 1}, **kw)


def test_a_shape_that_disagrees_with_the_plan_is_refused(plan):
    wrong = RoleShape("decode", str(plan.decode.engine_dir), "h", "s", gpus_per_instance=2, tp=2)
    with pytest.raises(ConfigError, match="build plan's decode role is TP4"):
        render_manifests("llama", 1, {"decode": wrong}, {"decode": 1}, plan=plan, model_path=MODEL,
                         engines=EnginesVolume(pvc_name="e"), kv_key=KEY, gateway_image="g")
    with pytest.raises(ConfigError, match="not both"):
        render(plan, {"colocated": 1, "prefill": 1})


def test_rendering_does_not_import_the_kubernetes_client():
    code = ("import sys, trtpd.controller, trtpd.controller.k8s.manifests; "
            "assert 'kubernetes' not in sys.modules and 'kubernetes_validate' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


def test_the_gateway_needs_an_api_key_from_a_secret_only_it_mounts(plan):
    import base64

    from trtpd.gateway.api_keys import derived_api_key
    manifests = by_name(render(plan, {"prefill": 1, "decode": 1}))
    secret = manifests[("Secret", "llama-api-key")]
    assert base64.b64decode(secret["data"]["keys"]).decode() == derived_api_key(KEY) + "\n"
    pod = manifests[("Deployment", "llama-gateway")]["spec"]["template"]["spec"]
    argv = pod["containers"][0]["command"]
    assert argv[argv.index("--api-key-file") + 1] == "/etc/trtpd/api/keys" and "--no-auth" not in argv
    volume = next(v for v in pod["volumes"] if v["name"] == "api-key")
    assert volume["secret"] == {"secretName": "llama-api-key", "defaultMode": 0o400}
    others = [m for (kind, name), m in manifests.items() if kind == "Deployment" and name != "llama-gateway"]
    assert others and not any(v.get("secret", {}).get("secretName") == "llama-api-key"
                              for m in others for v in m["spec"]["template"]["spec"].get("volumes", []))


def test_prestop_pause_is_not_sized_from_a_timeout_the_servers_do_not_enforce():
    """The servers run --backend tensorrt, where 1.2.1 enforces no kv_transfer_timeout_ms (py_executor.py only):
    the pause is the gateway's routing margin plus one full prefill step's KV at the stated floor bandwidth."""
    def plan_with(**kw):
        return plan_build(make_request("llama-2-70b", load_recipes(), BuildOverrides(prefill_tp=2, decode_tp=4, **kw),
                                       engines_dir=Path("/engines")))
    assert drain_seconds(plan_with(kv_transfer_timeout_ms=60000)) == drain_seconds(plan_with(kv_transfer_timeout_ms=1000))
    # 8192 tokens x 160 KiB (Llama-2-70B FP8: 2 x 80 layers x 8 KV heads x 128 x 1 B) = 1.34 GB -> 2 s at 1 GB/s
    assert drain_seconds(plan_with()) == 5 + 2
    assert drain_seconds(plan_with(prefill_max_num_tokens=16384)) == 5 + 3
    plan = plan_with()
    assert all(("--backend", "tensorrt") in w.args
               for w in worker_commands(plan, plan_mpi_world(plan.request), ServeLayout(), "."))
