"""The deployment spec's `kubernetes:` section: errors that name the file, line and field; what it relaxes (TP > 1
on trtllm-serve pods); the build plan recovered from the engines' manifests is the one they were built from."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trtpd.controller.k8s.from_spec import build_plan, k8s_fleet
from trtpd.controller.k8s.manifests import role_options_yaml, serve_argv
from trtpd.controller.spec import load_spec
from trtpd.errors import ConfigError
from trtpd.schema.manifest import write_manifest
from trtpd.trtllm.plan import plan_build
from trtpd.trtllm.recipe import load_recipes
from trtpd.trtllm.spec import BuildOverrides, make_request


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(engines mount, the plan) with finished manifests for prefill TP2 and decode TP4."""
    mount = tmp_path_factory.mktemp("engines")
    return mount, finished_engines(mount)


def finished_engines(mount: Path):
    """llama-2-70b engines, prefill TP2 and decode TP4, as a finished `trtpd build` leaves them under `mount`
    (manifests complete, with the KV scales both checkpoints were found to share; no weights); their plan."""
    plan = plan_build(make_request("llama-2-70b", load_recipes(), BuildOverrides(prefill_tp=2, decode_tp=4),
                                   engines_dir=mount))
    for role in plan.roles:
        role.engine_dir.mkdir(parents=True)
        write_manifest(role.manifest.model_copy(update={"status": "complete", "kv_scales_digest": "5ca1e5"}),
                       role.engine_dir)
        (role.engine_dir / "config.json").write_text("{}")
    return plan


def spec_text(mount: Path, **change) -> str:
    spec = {"name": "llama", "model": "llama-2-70b", "backend": "trtllm-serve",
            "engines": {"build_root": str(mount / "llama-2-70b")},
            "roles": {"prefill": {"instances": 1, "tp": 2}, "decode": {"instances": 2, "tp": 4}},
            "kubernetes": {"api_server": "https://10.0.0.1:6443", "gateway_image": "registry.example/trtpd:1",
                           "engines": {"mount_path": str(mount), "pvc_name": "engines"}}}
    for dotted, value in change.items():
        *parents, leaf = dotted.split("__")
        node = spec
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return yaml.safe_dump(spec, sort_keys=False)


def load(tmp_path: Path, text: str):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return load_spec(path)


def test_a_kubernetes_spec_loads_with_tp_and_gpus(built, tmp_path):
    mount, _ = built
    spec = load(tmp_path, spec_text(mount))
    assert spec.kubernetes.image.startswith("nvcr.io/nvidia/tensorrt-llm/release:")
    assert spec.kubernetes.namespace == "default" and spec.kv_transport == "ucx"
    assert [spec.gpus_per_instance(r) for r in ("prefill", "decode")] == [2, 4]
    fleet = k8s_fleet(spec, bytes(32))
    assert fleet.model_path == str(mount / "llama-2-70b" / "deploy" / "tokenizer")
    # without the section the same spec is the CPU twin's, which runs TP1 only
    with pytest.raises(ConfigError, match=r"spec.yaml:\d+: roles.prefill.tp: the trtllm-serve backend runs"):
        load(tmp_path, spec_text(mount, kubernetes=None))


@pytest.mark.parametrize("change, where", [
    ({"backend": "reference", "kv_transport": "shm"}, "backend: reference: the Kubernetes executor runs one trtllm"),
    ({"kv_transport": "mpi"}, "kv_transport: 'mpi': trtllm-serve pods move KV"),
    ({"name": "Llama"}, "name: 'Llama': on Kubernetes it prefixes Service names"),
    ({"kubernetes__in_cluster": True}, "kubernetes.in_cluster: true with api_server set"),
    ({"kubernetes__api_server": None, "kubernetes__token_file": "t"}, "kubernetes.token_file: needs kubernetes.api"),
    ({"kubernetes__context": "prod"}, "kubernetes.context: only without api_server"),
    ({"kubernetes__api_server": "10.0.0.1:6443"}, "kubernetes.api_server: '10.0.0.1:6443': a URL"),
    ({"kubernetes__engines__host_path": "/srv"}, "kubernetes.engines: give exactly one of pvc_name"),
    ({"kubernetes__engines__mount_path": "/elsewhere"}, "engines.build_root: .* is not under kubernetes.engines"),
    ({"kubernetes__gateway_image": None}, "kubernetes.gateway_image: Field required"),
    ({"kubernetes__namespace": "Prod_1"}, "kubernetes.namespace: String should match pattern"),
    ({"kubernetes__replicas": 3}, "kubernetes.replicas: Extra inputs are not permitted"),
])
def test_bad_input_names_the_field(built, tmp_path, change, where):
    mount, _ = built
    with pytest.raises(ConfigError, match=r"spec.yaml:\d+: " + where):
        load(tmp_path, spec_text(mount, **change))


def test_the_build_plan_is_the_one_the_engines_were_built_from(built, tmp_path):
    mount, plan = built
    spec = load(tmp_path, spec_text(mount, kv_transfer_timeout_ms=plan.request.kv_transfer_timeout_ms))
    again = build_plan(spec)
    assert again.request.prefill == plan.request.prefill and again.request.decode == plan.request.decode
    assert [r.engine_dir for r in again.roles] == [r.engine_dir for r in plan.roles]
    fleet, shapes = k8s_fleet(spec, bytes(32)), spec.role_shapes()
    for role in ("prefill", "decode"):
        assert role_options_yaml(again, role) == role_options_yaml(plan, role)
        assert serve_argv(again, role, shapes[role], fleet) == serve_argv(plan, role, shapes[role], fleet)
    # the spec's KV settings are the revision's: they go into cache_transceiver_config
    other = build_plan(load(tmp_path, spec_text(mount, kv_transfer_timeout_ms=12345, kv_transport="nixl")))
    options = yaml.safe_load(role_options_yaml(other, "decode"))["cache_transceiver_config"]
    assert (options["backend"], options["kv_transfer_timeout_ms"]) == ("NIXL", 12345)


def test_an_unfinished_engine_is_refused(built, tmp_path):
    mount, plan = built
    spec = load(tmp_path, spec_text(mount))
    manifest = plan.decode.engine_dir / "manifest.json"
    finished = manifest.read_text()
    try:
        write_manifest(plan.decode.manifest, plan.decode.engine_dir)      # status "planned"
        with pytest.raises(ConfigError, match="decode engine's manifest says backend tensorrtllm, status planned"):
            build_plan(spec)
    finally:
        manifest.write_text(finished)
