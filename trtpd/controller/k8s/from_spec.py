"""A deployment spec with a `kubernetes:` section, as the Kubernetes executor needs it (pure; files read: the engines'
manifests).

`build_plan(spec)`: the trtllm-serve build plan of a revision's engines, recovered from their manifests (the sizes
`trtpd build` compiled in, which become trtllm-serve's flags and options) plus the spec's KV transport and
timeout. `k8s_fleet(spec, kv_key)`: what does not change between revisions (namespace, images, volume, ports).
"""

from __future__ import annotations

from pathlib import Path

from trtpd.controller.k8s.manifests import EnginesVolume, K8sFleet
from trtpd.controller.spec import DeploymentSpec
from trtpd.errors import ConfigError
from trtpd.schema.manifest import EngineManifest, load_manifest
from trtpd.trtllm.plan import BuildPlan, plan_build
from trtpd.trtllm.recipe import load_recipes
from trtpd.trtllm.spec import BuildOverrides, make_request


def _built(spec: DeploymentSpec, role: str) -> EngineManifest:
    engine = spec.engine_dir(role)
    manifest = load_manifest(engine)
    if manifest.backend != "tensorrtllm" or manifest.status != "complete":
        raise ConfigError(f"{engine}: the {role} engine's manifest says backend {manifest.backend}, status "
                          f"{manifest.status}; trtllm-serve pods need a finished TensorRT-LLM engine (`trtpd build "
                          f"--model {spec.model}`, then point engines.{role} or engines.build_root at it)")
    return manifest


def build_plan(spec: DeploymentSpec) -> BuildPlan:
    """Colocated: the one engine sizes both of the plan's roles (manifests.role_plan reads its decode role)."""
    if spec.kubernetes is None:
        raise ConfigError(f"deployment {spec.name}: no kubernetes section")
    roles = ("prefill", "decode") if spec.mode == "disaggregated" else ("colocated", "colocated")
    prefill, decode = (_built(spec, role) for role in roles)
    p, d = prefill.build_config, decode.build_config
    if (p.max_input_len, p.max_seq_len, p.tokens_per_block) != (d.max_input_len, d.max_seq_len, d.tokens_per_block):
        raise ConfigError(f"deployment {spec.name}: the prefill and decode engines differ in max_input_len, "
                          f"max_seq_len or tokens_per_block ({p.max_input_len}/{p.max_seq_len}/{p.tokens_per_block} "
                          f"vs {d.max_input_len}/{d.max_seq_len}/{d.tokens_per_block}); build both in one "
                          f"`trtpd build`")
    overrides = BuildOverrides.of_engines(prefill, decode, transceiver_backend=spec.kv_transport,
                                          kv_transfer_timeout_ms=spec.kv_transfer_timeout_ms)
    # plan_build names each engine <engines_dir>/<model>/<role>-tp<tp>: trtpd build's layout
    engines_dir = spec.engine_dir(roles[0]).parent.parent
    request = make_request(spec.model, load_recipes(), overrides, engines_dir=engines_dir,
                           hf_model=prefill.inputs.model_source)
    return plan_build(request)


def model_path(spec: DeploymentSpec) -> Path:
    """The tokenizer folder: kubernetes.model_path, else the deploy folder's copy that trtpd build makes
    (<engines_dir>/<model>/deploy/tokenizer, trtpd/trtllm/deploy.py)."""
    return spec.kubernetes.model_path or spec.engine_dir(spec.role_names[0]).parent / "deploy" / "tokenizer"


def k8s_fleet(spec: DeploymentSpec, kv_key: bytes) -> K8sFleet:
    k = spec.kubernetes
    if k is None:
        raise ConfigError(f"deployment {spec.name}: no kubernetes section")
    engines = EnginesVolume(str(k.engines.mount_path), k.engines.pvc_name, k.engines.host_path)
    return K8sFleet(spec.name, str(model_path(spec)), engines, kv_key, k.gateway_image, k.namespace, k.image,
                    k.gateway_port, k.serve_port)


def gateway_url(spec: DeploymentSpec, fleet: K8sFleet) -> str:
    return spec.kubernetes.gateway_url or fleet.gateway_url
