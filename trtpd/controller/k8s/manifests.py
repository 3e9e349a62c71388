"""Kubernetes manifests for one trtpd deployment on the trtllm-serve path (pure: data in, dicts out).

Per role and revision an apps/v1 Deployment `<name>-<role>-r<revision>` whose pods each run one trtllm-serve
instance (the command and the role's extra_llm_api_options YAML come from trtpd/trtllm/serve_config.py, the same
code that writes launch.sh), a ConfigMap with that YAML, and, shared by every revision: a headless Service per
role, the KV key Secret, the gateway's Deployment, Service and fleet-file ConfigMap, and a NetworkPolicy that
admits to instance pods only pods of the same trtpd deployment.

A revision's pod template never changes: a new config is a new revision, hence a new Deployment, so the
Deployment's own rolling update never runs; the controller moves replicas between revisions itself.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass, field

import yaml

from trtpd.trtllm.mpi_world import InstanceRanks, RankLayout, plan_mpi_world
from trtpd.trtllm.options import check_args, require_valid
from trtpd.trtllm.plan import BuildPlan, RolePlan
from trtpd.trtllm.serve_config import (SERVER_START_TIMEOUT_S, ServeLayout, render_serve_files, role_llm_options,
                                      worker_commands)
from trtpd.trtllm.versions import PINNED
from trtpd.controller.k8s.fleet_file import FLEET_DIR, FLEET_FILE, KEY_DIR, KEY_FILE, fleet_document
from trtpd.controller.types import ROLES, RoleShape
from trtpd.errors import ConfigError

DEFAULT_IMAGE = f"nvcr.io/nvidia/tensorrt-llm/release:{PINNED.tensorrt_llm}"   # the trtllm-serve container
LABEL_APP = "app.kubernetes.io/name"
LABEL_FLEET = "app.kubernetes.io/instance"          # the trtpd deployment's name
LABEL_COMPONENT = "app.kubernetes.io/component"     # instance | gateway
LABEL_ROLE = "trtpd.dev/role"
LABEL_REVISION = "trtpd.dev/revision"
LABEL_INSTANCE = "trtpd.dev/instance"               # the controller's instance name, put on a pod when bound
LABEL_STATE = "trtpd.dev/state"                     # draining | stopped (set by the executor)
PENDING_ANNOTATION = "trtpd.dev/pending-instances"  # JSON list: controller names started, not yet bound to a pod
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
SERVE_CONFIG_DIR = "/etc/trtpd/serve"
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")   # a DNS-1035 label with room for "-colocated-r99"
SHUTDOWN_S = 30                                     # trtllm-serve's own exit after SIGTERM


@dataclass(frozen=True)
class EnginesVolume:
    """Where engines, checkpoints and the tokenizer come from, mounted read-only at `mount_path`: a
    PersistentVolumeClaim (`pvc_name`) or a folder present on every GPU node (`host_path`)."""

    mount_path: str = "/engines"
    pvc_name: str = ""
    host_path: str = ""

    def volume(self) -> dict:
        if bool(self.pvc_name) == bool(self.host_path):
            raise ConfigError("engines volume: give exactly one of pvc_name (a PersistentVolumeClaim) or host_path "
                              f"(a folder on every GPU node); got pvc_name={self.pvc_name!r}, "
                              f"host_path={self.host_path!r}")
        if self.pvc_name:
            return {"name": "engines", "persistentVolumeClaim": {"claimName": self.pvc_name, "readOnly": True}}
        return {"name": "engines", "hostPath": {"path": self.host_path, "type": "Directory"}}

    def check_inside(self, path: str, what: str) -> None:
        root = self.mount_path.rstrip("/") + "/"
        if not path.startswith(root):
            raise ConfigError(f"{what} {path!r} is not under the engines mount {self.mount_path!r}: build with "
                              f"--engines-dir {self.mount_path} (or mount the volume where the plan's paths are)")


@dataclass(frozen=True)
class K8sFleet:
    """Everything about one trtpd deployment on Kubernetes that does not change between revisions."""

    name: str
    model_path: str                 # folder with the tokenizer inside the engines mount, e.g. engines/<model>/deploy/
                                    # tokenizer (trtpd build copies it there; trtllm/tokenizer_files.py)
    engines: EnginesVolume
    kv_key: bytes                   # the deployment key (trtpd/kv/handle.py), stored as a Secret
    gateway_image: str              # an image with trtpd installed (the TensorRT-LLM containers have none)
    namespace: str = "default"
    image: str = DEFAULT_IMAGE
    gateway_port: int = 8000
    serve_port: int = 8000
    extra_labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise ConfigError(f"deployment name {self.name!r}: use 1-40 lower-case letters, digits and '-', starting "
                              f"with a letter (it prefixes Service names, which are DNS-1035 labels)")
        self.engines.check_inside(self.model_path, "model_path")

    @property
    def gateway_url(self) -> str:
        return f"http://{self.name}-gateway.{self.namespace}.svc:{self.gateway_port}"

    def labels(self, component: str, **extra: str) -> dict[str, str]:
        return {**self.extra_labels, LABEL_APP: "trtpd", LABEL_FLEET: self.name, LABEL_COMPONENT: component, **extra}

    def role_selector(self) -> str:
        """The label selector of every instance pod of this deployment (all roles, all revisions)."""
        return f"{LABEL_APP}=trtpd,{LABEL_FLEET}={self.name},{LABEL_COMPONENT}=instance"

    def meta(self, name: str, labels: dict, annotations: dict | None = None) -> dict:
        meta = {"name": name, "namespace": self.namespace, "labels": labels}
        if annotations:
            meta["annotations"] = annotations
        return meta


def deployment_name(fleet: str, role: str, revision: int) -> str:
    return f"{fleet}-{role}-r{revision}"


def serve_config_name(fleet: str, role: str, revision: int) -> str:
    return f"{fleet}-{role}-r{revision}-serve"


def key_secret_name(fleet: str) -> str:
    return f"{fleet}-kv-key"


def fleet_configmap_name(fleet: str) -> str:
    return f"{fleet}-fleet"


# The preStop pause (drain_seconds). The servers trtpd renders run compiled engines (`trtllm-serve --backend
# tensorrt`, serve_config.worker_commands), where TensorRT-LLM 1.2.1 enforces no KV-transfer timeout: only the
# PyTorch executor reads kv_transfer_timeout_ms (_torch/pyexecutor/py_executor.py, PR #6801; trtpd lint rule
# transfer-timeout-scope), so the pause cannot be "until a pull finishes or expires". It is sized from what trtpd
# knows and states instead:
ROUTING_MARGIN_S = 5                 # the gateway stops routing to a drained instance (PUT /admin, fleet file)
KV_LINK_FLOOR_BYTES_PER_S = 1.0e9    # slowest lane assumed for a pull: UCX over TCP on a 10 GbE pod network


def drain_seconds(plan: BuildPlan) -> int:
    """preStop sleep: the gateway's routing margin, plus the time a healthy pull of one full prefill step's KV
    (prefill max_num_tokens x the model's KV bytes per token) takes at KV_LINK_FLOOR_BYTES_PER_S. It bounds
    nothing on a stuck peer: the hard bound is the pod's terminationGracePeriodSeconds (this + SHUTDOWN_S), after
    which the kubelet kills trtllm-serve and a pull still running fails with it."""
    r = plan.request
    step_kv_bytes = r.prefill.max_num_tokens * r.model.kv_bytes_per_token(r.kv_dtype)
    return ROUTING_MARGIN_S + math.ceil(step_kv_bytes / KV_LINK_FLOOR_BYTES_PER_S)


# ---- one role of one revision ---------------------------------------------------------------------

def role_plan(plan: BuildPlan, role: str) -> RolePlan:
    """colocated: one trtllm-serve serving whole requests, sized by the plan's decode role (its engine runs both
    phases) and without cache_transceiver_config."""
    return plan.prefill if role == "prefill" else plan.decode


def role_options_yaml(plan: BuildPlan, role: str) -> str:
    if role == "colocated":
        options = {k: v for k, v in role_llm_options(plan, plan.decode).items() if k != "cache_transceiver_config"}
        return yaml.safe_dump(options, sort_keys=False)
    world = plan_mpi_world(plan.request)
    return render_serve_files(plan, world, ServeLayout(), "serve")[f"serve/{role}.yaml"]


def serve_argv(plan: BuildPlan, role: str, shape: RoleShape, fleet: K8sFleet) -> list[str]:
    """trtllm-serve's argv in the pod: serve_config.worker_commands for one instance of the role, listening on
    0.0.0.0:serve_port, reading the tokenizer and engine from the mount and its options from the ConfigMap."""
    rp = role_plan(plan, role)
    spec = rp.spec
    gpus = shape.gpus_per_instance or shape.tp
    if gpus != spec.gpus_per_instance:
        raise ConfigError(f"{role}: the revision's shape asks for {gpus} GPU(s) per instance but the build plan's "
                          f"{spec.role} role is TP{spec.tp_size}*PP{spec.pp_size} = {spec.gpus_per_instance}; "
                          f"render from the plan the engine was built with")
    fleet.engines.check_inside(shape.engine_dir, f"{role} engine_dir")
    one = (InstanceRanks(spec.role, 0, tuple(range(1, gpus + 1)), tuple(range(gpus))),)
    world = RankLayout(one if spec.role == "prefill" else (), one if spec.role == "decode" else ())
    layout = ServeLayout(host="0.0.0.0", first_worker_port=fleet.serve_port)
    (command,) = worker_commands(plan, world, layout, SERVE_CONFIG_DIR)
    given = {"--tokenizer": fleet.model_path, "--extra_llm_api_options": f"{SERVE_CONFIG_DIR}/{role}.yaml"}
    args = [(flag, given.get(flag, value)) for flag, value in command.args]
    require_valid(check_args("trtllm-serve", args), f"trtllm-serve command for {role} pods")
    return ["trtllm-serve", shape.engine_dir] + [t for f, v in args for t in ((f,) if v is None else (f, v))]


def _http_probe(path: str, period_s: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s, "timeoutSeconds": 5,
            "failureThreshold": failures}


def _key_volume(fleet: K8sFleet) -> dict:
    return {"name": "kv-key", "secret": {"secretName": key_secret_name(fleet.name), "defaultMode": 0o400}}


def role_deployment(fleet: K8sFleet, plan: BuildPlan, role: str, revision: int, shape: RoleShape,
                    replicas: int) -> dict:
    selector = fleet.labels("instance", **{LABEL_ROLE: role, LABEL_REVISION: str(revision)})
    gpus = shape.gpus_per_instance or shape.tp
    hold_s = drain_seconds(plan)
    container = {
        "name": "trtllm-serve", "image": fleet.image, "command": serve_argv(plan, role, shape, fleet),
        "ports": [{"name": "http", "containerPort": fleet.serve_port, "protocol": "TCP"}],
        "env": [{"name": "TRTPD_KV_KEY_FILE", "value": KEY_FILE},
                {"name": "TRTPD_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
        # trtllm-serve answers GET /health once the engine is loaded: the startup probe allows as long as
        # launch.sh's router waits (SERVER_START_TIMEOUT_S) before liveness may restart the pod.
        "startupProbe": _http_probe("/health", 10, math.ceil(SERVER_START_TIMEOUT_S / 10)),
        "readinessProbe": _http_probe("/health", 5, 3),
        "livenessProbe": _http_probe("/health", 10, 6),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(hold_s)]}}},
        "volumeMounts": [
            {"name": "engines", "mountPath": fleet.engines.mount_path, "readOnly": True},
            {"name": "serve-config", "mountPath": SERVE_CONFIG_DIR, "readOnly": True},
            {"name": "kv-key", "mountPath": KEY_DIR, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},   # NCCL and MPI between a TP>1 instance's ranks
        ],
    }
    pod = {
        "metadata": {"labels": dict(selector),
                     "annotations": {"trtpd.dev/config-hash": shape.config_hash,
                                     "trtpd.dev/kv-signature": shape.kv_signature}},
        "spec": {
            "terminationGracePeriodSeconds": hold_s + SHUTDOWN_S,
            "enableServiceLinks": False,
            "containers": [container],
            "volumes": [fleet.engines.volume(),
                        {"name": "serve-config", "configMap": {"name": serve_config_name(fleet.name, role, revision)}},
                        _key_volume(fleet),
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }
    annotations = {PENDING_ANNOTATION: json.dumps([]), "trtpd.dev/config-hash": shape.config_hash}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": fleet.meta(deployment_name(fleet.name, role, revision), selector, annotations),
            "spec": {"replicas": replicas, "selector": {"matchLabels": dict(selector)},
                     "progressDeadlineSeconds": SERVER_START_TIMEOUT_S, "template": pod}}


def serve_configmap(fleet: K8sFleet, plan: BuildPlan, role: str, revision: int) -> dict:
    labels = fleet.labels("instance", **{LABEL_ROLE: role, LABEL_REVISION: str(revision)})
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": fleet.meta(serve_config_name(fleet.name, role, revision), labels),
            "data": {f"{role}.yaml": role_options_yaml(plan, role)}}


def role_service(fleet: K8sFleet, role: str) -> dict:
    """Headless: DNS lists the ready pods of the role (every revision), for discovery and debugging."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": fleet.meta(f"{fleet.name}-{role}", fleet.labels("instance", **{LABEL_ROLE: role})),
            "spec": {"clusterIP": "None", "selector": fleet.labels("instance", **{LABEL_ROLE: role}),
                     "ports": [{"name": "http", "port": fleet.serve_port, "protocol": "TCP"}]}}


# ---- shared by every revision ---------------------------------------------------------------------

def key_secret(fleet: K8sFleet) -> dict:
    """The key file as trtpd/kv/handle.py reads it (hex text); mounted read-only, mode 0400."""
    text = fleet.kv_key.hex() + "\n"
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": fleet.meta(key_secret_name(fleet.name), fleet.labels("key")),
            "data": {"key": base64.b64encode(text.encode()).decode()}}


API_KEY_DIR = "/etc/trtpd/api"


def api_key_secret_name(fleet: str) -> str:
    return f"{fleet}-api-key"


def api_key_secret(fleet: K8sFleet) -> dict:
    """The gateway's API key (one line, as --api-key-file reads it), derived from the deployment key; mounted only
    in the gateway's pod, mode 0400. Read it with `kubectl get secret NAME-api-key -o jsonpath={.data.keys}`."""
    from trtpd.gateway.api_keys import derived_api_key
    text = derived_api_key(fleet.kv_key) + "\n"
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": fleet.meta(api_key_secret_name(fleet.name), fleet.labels("gateway")),
            "data": {"keys": base64.b64encode(text.encode()).decode()}}


def fleet_configmap(fleet: K8sFleet, mode: str, stable_revision: int) -> dict:
    text = fleet_document(fleet.name, mode, fleet.engines.mount_path, fleet.model_path, [],
                          {"stable_revision": stable_revision})
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": fleet.meta(fleet_configmap_name(fleet.name), fleet.labels("gateway")),
            "data": {FLEET_FILE: text}}


def gateway_deployment(fleet: K8sFleet) -> dict:
    """One replica: drains sent to PUT /admin are held in that process (the fleet file carries them too)."""
    labels = fleet.labels("gateway")
    argv = ["python", "-m", "trtpd.gateway", "--fleet-file", f"{FLEET_DIR}/{FLEET_FILE}", "--host", "0.0.0.0",
            "--port", str(fleet.gateway_port), "--api-key-file", f"{API_KEY_DIR}/keys"]
    container = {
        "name": "gateway", "image": fleet.gateway_image, "command": argv,
        "ports": [{"name": "http", "containerPort": fleet.gateway_port, "protocol": "TCP"}],
        "readinessProbe": _http_probe("/health", 5, 3),            # 503 while no role has a ready instance
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
        "volumeMounts": [{"name": "engines", "mountPath": fleet.engines.mount_path, "readOnly": True},
                         {"name": "fleet", "mountPath": FLEET_DIR, "readOnly": True},
                         {"name": "kv-key", "mountPath": KEY_DIR, "readOnly": True},
                         {"name": "api-key", "mountPath": API_KEY_DIR, "readOnly": True}],
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": fleet.meta(f"{fleet.name}-gateway", labels),
            "spec": {"replicas": 1, "selector": {"matchLabels": dict(labels)},
                     "template": {"metadata": {"labels": dict(labels)},
                                  "spec": {"containers": [container], "enableServiceLinks": False,
                                           "volumes": [fleet.engines.volume(),
                                                       {"name": "fleet",
                                                        "configMap": {"name": fleet_configmap_name(fleet.name)}},
                                                       _key_volume(fleet),
                                                       {"name": "api-key", "secret": {
                                                           "secretName": api_key_secret_name(fleet.name),
                                                           "defaultMode": 0o400}}]}}}}


def gateway_service(fleet: K8sFleet) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": fleet.meta(f"{fleet.name}-gateway", fleet.labels("gateway")),
            "spec": {"type": "ClusterIP", "selector": fleet.labels("gateway"),
                     "ports": [{"name": "http", "port": fleet.gateway_port, "targetPort": "http", "protocol": "TCP"}]}}


def instance_network_policy(fleet: K8sFleet) -> dict:
    """Instance pods (the OpenAI port and UCX's KV ports, which UCX picks at run time, hence every port) admit
    only pods of this trtpd deployment: its gateway and its other instances. RDMA traffic (UCX over
    InfiniBand/RoCE, GPUDirect) bypasses the pod network and this policy; KV is served only to holders of the
    key on the reference path, while trtllm-serve 1.2.1 itself does not authenticate KV peers."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": fleet.meta(f"{fleet.name}-instances", fleet.labels("instance")),
            "spec": {"podSelector": {"matchLabels": fleet.labels("instance")}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {LABEL_APP: "trtpd",
                                                                            LABEL_FLEET: fleet.name}}}]}]}}


def fleet_mode(roles) -> str:
    roles = set(roles)
    if not roles <= set(ROLES):
        raise ConfigError(f"unknown role(s) {', '.join(sorted(roles - set(ROLES)))}; use {', '.join(ROLES)}")
    if "colocated" in roles and roles & {"prefill", "decode"}:
        raise ConfigError("one deployment is either colocated or disaggregated (prefill + decode), not both")
    return "colocated" if "colocated" in roles else "disaggregated"


def fleet_manifests(fleet: K8sFleet, plan: BuildPlan, revision: int, shapes: dict[str, RoleShape],
                    replicas: dict[str, int]) -> list[dict]:
    if set(replicas) != set(shapes):
        raise ConfigError(f"replicas name roles {sorted(replicas)} but shapes name {sorted(shapes)}; give both")
    mode = fleet_mode(shapes)
    out = [key_secret(fleet), api_key_secret(fleet), fleet_configmap(fleet, mode, revision)]
    for role, shape in shapes.items():
        if shape.role != role:
            raise ConfigError(f"shapes[{role!r}] is a {shape.role} shape")
        out += [serve_configmap(fleet, plan, role, revision),
                role_deployment(fleet, plan, role, revision, shape, replicas[role]),
                role_service(fleet, role)]
    return out + [gateway_deployment(fleet), gateway_service(fleet), instance_network_policy(fleet)]


def render_manifests(name: str, revision: int, shapes: dict[str, RoleShape], replicas: dict[str, int], *,
                     plan: BuildPlan, model_path: str, engines: EnginesVolume, kv_key: bytes, gateway_image: str,
                     namespace: str = "default", image: str = DEFAULT_IMAGE, gateway_port: int = 8000,
                     serve_port: int = 8000) -> list[dict]:
    """Every object one revision of deployment `name` needs (pure). `plan` is the trtllm-serve build plan the
    revision's engines were built from (its sizes become trtllm-serve's flags)."""
    fleet = K8sFleet(name, model_path, engines, kv_key, gateway_image, namespace, image, gateway_port, serve_port)
    return fleet_manifests(fleet, plan, revision, shapes, replicas)


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:
        return True


def dump_yaml(manifests: list[dict]) -> str:
    """One multi-document YAML (`kubectl apply -f -`), without YAML anchors."""
    return "".join("---\n" + yaml.dump(m, Dumper=_NoAliases, sort_keys=False) for m in manifests)


def validate_manifests(manifests: list[dict], kubernetes_version: str = "1.30") -> list[str]:
    """Problems with each manifest against that Kubernetes version's OpenAPI schema, strict (an unknown field
    is an error, as `kubectl apply --validate=strict` makes it); empty when all are valid."""
    import kubernetes_validate
    from kubernetes_validate.utils import VersionNotSupportedError

    problems = []
    for m in manifests:
        where = f"{m.get('kind', '?')} {m.get('metadata', {}).get('name', '?')}"
        try:
            kubernetes_validate.validate(m, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.absolute_path) or "(top)"
            problems.append(f"{where}: {path}: {exc.message}")
        except (kubernetes_validate.SchemaNotFoundError, VersionNotSupportedError) as exc:
            problems.append(f"{where}: {exc.message}")
    return problems
