"""The deployment spec: what the controller keeps running (YAML, schema `trtpd/v1`, kind `Deployment`).

Every field with its default is in configs/deployments/README.md. `load_spec` reads a file and names the file,
line and field of every problem; the loaded spec is resolved (absolute paths, counts and TP from the plan, the
autoscaling bounds filled in), so its `spec_json()` is what the controller stores as a revision and reloads
with `DeploymentSpec.from_json`. The rest is pure: the shape of each role's instances (`role_shapes`), what a
new revision changes and how (`diff_specs`), and whether its engines can exchange KV (`check_revision`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from trtpd.controller.types import ROLES, UNITS, WORLD, RoleShape
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.errors import ConfigError
from trtpd.perf.yaml_io import dump_yaml
from trtpd.repo.reference import check_pair
from trtpd.routing.core import RoutingPolicy
from trtpd.schema.manifest import engine_folder_name, load_manifest
from trtpd.schema.plan import Plan, load_plan
from trtpd.schema.slo import Slo

HEADER = "# trtpd deployment spec (schema: trtpd/controller/spec.py, configs/deployments/README.md)\n"
MODE_ROLES = {"disaggregated": ("prefill", "decode"), "colocated": ("colocated",)}
# trtllm-serve: cache_transceiver_config.backend (TensorRT-LLM 1.2.1's literals, lower-cased); its CPU twin moves
# KV over trtpd's TCP transport whichever is named (docs/serve-twin.md)
# tensorrt-llm: Triton's tensorrtllm backend hard-codes CacheTransceiverConfig(BackendType::MPI) and no config.pbtxt
# key selects another (model_instance_state.cc @c8c6df0 and @0c8de69; shared/reference/trtllm-1.2.md §3.5)
KV_TRANSPORTS = {"reference": ("shm", "tcp", "ucx", "mpi"), "tensorrt-llm": ("mpi",),
                 "trtllm-serve": ("default", "ucx", "nixl", "mpi")}
DEFAULT_KV_TRANSPORT = {"reference": "shm", "tensorrt-llm": "mpi", "trtllm-serve": "ucx"}
# run here on the reference engines without a gpus section: trtllm-serve as its CPU twin, tensorrt-llm as the
# single-server reference deployment standing in for a Triton MPI world (prefill and decode in one tritonserver)
CPU_BACKENDS = ("reference", "trtllm-serve", "tensorrt-llm")
RESTART_FIELDS = ("tp", "cpus_per_instance", "gpus_per_instance", "max_batch_size", "step_delay_ms")
ALL_ROLES_RESTART = ("backend", "model", "mode", "kv_transport", "kv_transfer_timeout_ms")
Problem = tuple[tuple, str]     # (loc in the YAML, message)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnginesSpec(_Strict):
    build_root: Path | None = None       # <build_root>/<role>-tp<tp>/ per role (trtpd build's layout)
    prefill: Path | None = None          # per-role overrides: an engine folder
    decode: Path | None = None
    colocated: Path | None = None


class RoleSpec(_Strict):
    instances: int | None = Field(None, ge=0)   # None: the plan's num_instances, else 1
    tp: int | None = Field(None, ge=1)          # None: the plan's tp, else 1
    cpus_per_instance: int = Field(1, ge=1)
    gpus_per_instance: int = Field(0, ge=0)     # 0: tp on the tensorrt-llm backend, none on the reference one
    max_batch_size: int = Field(64, ge=1)
    step_delay_ms: int = Field(0, ge=0)         # fault injection: a pause after every engine step


class RolesSpec(_Strict):
    prefill: RoleSpec | None = None
    decode: RoleSpec | None = None
    colocated: RoleSpec | None = None


class RoutingSpec(_Strict):
    balance: Literal["least_loaded", "round_robin"] = "least_loaded"
    decode_load: Literal["free_kv_blocks", "sequences"] = "free_kv_blocks"
    tie_break: Literal["name", "least_recent"] = "least_recent"
    max_prefill_attempts: int = Field(2, ge=1)
    max_decode_attempts: int = Field(2, ge=1)   # a decode instance lost before the first token: once more elsewhere
    spill_to_longer_buckets: bool = False


class GatewaySpec(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)        # 0: a free port, kept across gateway restarts
    max_inflight: int = Field(64, ge=1)
    max_queued: int = Field(256, ge=0)
    api_key_file: str | None = None             # None: the deployment's api.key (made, 0600, on the first `up`)
    auth: bool = True                           # false: no API key (loopback hosts only)

    @model_validator(mode="after")
    def _auth_on_loopback(self):
        from trtpd.gateway.api_keys import is_loopback
        if not self.auth and not is_loopback(self.host):
            raise ValueError(f"auth: false is allowed on a loopback host only (host is {self.host})")
        if not self.auth and self.api_key_file:
            raise ValueError("api_key_file is set but auth is false; drop one")
        return self


class AutoscalingSpec(_Strict):
    enabled: bool = False
    mode: Literal["observe", "act"] = "observe"  # observe: decide and record only; act: scale
    interval_s: float = Field(5.0, gt=0)
    cooldown_s: float = Field(30.0, ge=0)
    min: dict[str, int] = Field(default_factory=dict)   # per role; default 1
    max: dict[str, int] = Field(default_factory=dict)   # per role; default the role's instances
    budget_cpus: int | None = Field(None, ge=1)         # None: no limit
    budget_gpus: int | None = Field(None, ge=0)
    # the hardware profile (configs/hardware/, or a YAML of `trtpd profile`) the autoscaler models the instances
    # on; None: cpu-reference on CPUs, the plan's on GPUs (required on GPUs without a plan)
    hardware: str | None = None


class RolloutSpec(_Strict):
    canary_share: float = Field(0.25, gt=0, le=1)
    bake_s: float = Field(20.0, ge=0)
    min_requests: int = Field(10, ge=0)
    max_ttft_ratio: float = Field(1.5, gt=0)
    max_tpot_ratio: float = Field(1.5, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _no_itl(cls, data):
        if isinstance(data, dict) and "max_itl_ratio" in data:
            raise ValueError("max_itl_ratio: the gate judges decode by TPOT (as the SLO does); use max_tpot_ratio")
        return data
    max_error_rate: float = Field(0.0, ge=0, le=1)
    drain_timeout_s: float = Field(30.0, gt=0)
    start_timeout_s: float = Field(180.0, gt=0)


class GpusSpec(_Strict):
    """Present (local executor): the instances run on this machine's GPUs, each on its own set of `devices`
    (CUDA_VISIBLE_DEVICES). backend trtllm-serve: real trtllm-serve workers as `trtpd build`'s deploy/serve-pytorch/
    starts them (trtpd/fleet/gpu_workers.py); backend tensorrt-llm: Triton MPI worlds rendered from the build's
    deploy/ folder for each revision's counts (trtpd/trtllm/world.py). Absent: the CPU twin or stand-in."""

    devices: list[int] | Literal["auto"]  # the inventory (nvidia-smi's ids); auto: every GPU `nvidia-smi -L` lists
    # None: <engines.build_root>/deploy/serve-pytorch (trtllm-serve), <engines.build_root>/deploy (tensorrt-llm)
    serve_dir: Path | None = None
    serve_command: str = "trtllm-serve"   # the program given trtllm-serve's command line (split as a shell would)


class KubernetesEnginesSpec(_Strict):
    mount_path: Path = Path("/engines")   # where pods see the volume; every engine folder must be under it
    pvc_name: str = ""                    # a PersistentVolumeClaim, or
    host_path: str = ""                   # a folder present on every GPU node


class KubernetesSpec(_Strict):
    """Present: the controller's instances are pods of this cluster (trtpd/controller/k8s/), not local processes.
    The API: `api_server` (+ `token_file`, `ca_file`), or `in_cluster`, or else a kubeconfig."""

    api_server: str | None = None         # e.g. https://10.0.0.1:6443
    token_file: Path | None = None        # a bearer token, re-read before each request (rotated tokens)
    ca_file: Path | None = None           # the API server's CA bundle (https)
    kubeconfig: Path | None = None        # None: $KUBECONFIG or ~/.kube/config, as kubectl
    context: str | None = None            # the kubeconfig's context (None: its current-context)
    in_cluster: bool = False              # the pod's service account (the controller runs in the cluster)
    namespace: str = Field("default", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    image: str | None = None              # trtllm-serve's image; None: the pinned TensorRT-LLM release
    gateway_image: str                    # an image with trtpd installed (the gateway pod)
    engines: KubernetesEnginesSpec = Field(default_factory=KubernetesEnginesSpec)
    model_path: Path | None = None        # the tokenizer folder in the mount; None: <engines dir>/../deploy/tokenizer
    gateway_url: str | None = None        # how the controller reaches the gateway; None: its Service's DNS name
    gateway_port: int = Field(8000, ge=1, le=65535)
    serve_port: int = Field(8000, ge=1, le=65535)


class DeploymentSpec(_Strict):
    api_version: Literal["trtpd/v1"] = "trtpd/v1"
    kind: Literal["Deployment"] = "Deployment"
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
    model: str
    backend: Literal["reference", "tensorrt-llm", "trtllm-serve"] = "reference"
    mode: Literal["disaggregated", "colocated"] = "disaggregated"
    engines: EnginesSpec = Field(default_factory=EnginesSpec)
    kv_transport: str | None = None             # None: shm (reference), mpi (tensorrt-llm), ucx (trtllm-serve)
    kv_transfer_timeout_ms: int = Field(30000, gt=0)
    roles: RolesSpec
    plan: Path | None = None
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    slo: Slo = Field(default_factory=Slo)      # trtpd.schema.slo: the one SLO type (decode judged by TPOT)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    kubernetes: KubernetesSpec | None = None   # None: local processes (the local executor)
    gpus: GpusSpec | None = None               # None: on CPUs (trtllm-serve: its twin); see GpusSpec

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo) -> "DeploymentSpec":
        context = info.context or {}
        problems = _resolve(self, Path(context.get("base_dir", ".")), context.get("trust_resolved", False))
        if problems and "problems" in context:
            context["problems"].extend(problems)
        elif problems:
            raise ValueError("; ".join(f"{_dotted(loc)}: {msg}" for loc, msg in problems))
        return self

    @classmethod
    def from_json(cls, data: dict) -> "DeploymentSpec":
        """A stored revision (spec_json()): its resolved counts stand, whatever its plan file says now."""
        try:
            return cls.model_validate(data, context={"trust_resolved": True})
        except ValidationError as exc:
            raise ConfigError(f"stored deployment spec is invalid: {exc}") from None

    # -- what the controller asks -----------------------------------------------------------------
    @property
    def role_names(self) -> tuple[str, ...]:
        return MODE_ROLES[self.mode]

    def role(self, role: str) -> RoleSpec:
        spec = getattr(self.roles, role) if role in ROLES else None
        if spec is None or role not in self.role_names:
            raise ConfigError(f"deployment {self.name}: no role {role!r} in mode {self.mode} "
                              f"(roles: {', '.join(self.role_names)})")
        return spec

    def counts(self) -> dict[str, int]:
        return {role: self.role(role).instances for role in self.role_names}

    # -- the controller's units: an instance per role, or (tensorrt-llm) one world per revision ----------------
    @property
    def worlds(self) -> bool:
        """backend tensorrt-llm: a revision runs as one Triton MPI world holding every instance of every role, so
        the controller's unit is the world (role WORLD, one per revision): new counts or a new config mean a new
        world beside the old one (blue/green through a rollout), never an instance added to a running world."""
        return self.backend == "tensorrt-llm"

    @property
    def unit_names(self) -> tuple[str, ...]:
        return (WORLD,) if self.worlds else self.role_names

    def unit_counts(self) -> dict[str, int]:
        """What the controller keeps running of the stable revision: {role: n}, or {"world": 1}."""
        return {WORLD: 1} if self.worlds else self.counts()

    def unit_shapes(self) -> dict[str, RoleShape]:
        """The controller's shapes: role_shapes(), or the world's (its roles' shapes and counts inside)."""
        shapes = self.role_shapes()
        if not self.worlds:
            return shapes
        members = tuple((shapes[r], self.role(r).instances) for r in self.role_names)
        first = shapes[self.role_names[0]]
        return {WORLD: RoleShape(
            role=WORLD, engine_dir=str(Path(first.engine_dir).parent),
            config_hash=_digest([(m.config_hash, n) for m, n in members]), kv_signature=first.kv_signature,
            cpus_per_instance=sum(m.cpus_per_instance * n for m, n in members),
            gpus_per_instance=self.world_gpus(self.counts()), kv_transport=self.kv_transport,
            kv_transfer_timeout_ms=self.kv_transfer_timeout_ms, backend=self.backend, world_roles=members,
            step_delay_ms=max(m.step_delay_ms for m, _ in members), gpu_ids=first.gpu_ids,
            serve_dir=first.serve_dir)}

    def world_gpus(self, counts: dict[str, int]) -> int:
        """GPUs a world of `counts` instances holds (the orchestrator rank holds none); 0 on CPUs."""
        return sum(n * self.gpus_per_instance(r) for r, n in counts.items())

    def gpus_per_instance(self, role: str) -> int:
        spec = self.role(role)
        on_gpus = self.kubernetes is not None or self.gpus is not None
        return spec.gpus_per_instance or (spec.tp if on_gpus else 0)

    def serve_dir(self) -> Path:
        """The folder the GPU instances come from (gpus.serve_dir, else beside the engines): deploy/serve-pytorch/
        for trtllm-serve workers, the build's deploy/ for Triton worlds."""
        from trtpd.trtllm.deploy import SERVE_PYTORCH_DIR
        if self.gpus is not None and self.gpus.serve_dir is not None:
            return self.gpus.serve_dir
        deploy = self.engine_dir(self.role_names[0]).parent / "deploy"
        return deploy if self.worlds else deploy / SERVE_PYTORCH_DIR

    def _parts(self, counts: dict[str, int]) -> str:
        return " + ".join(f"{r} {n}x{self.gpus_per_instance(r)}" for r, n in counts.items())

    def gpu_shortage(self, counts: dict[str, int]) -> str | None:
        """Why `counts` instances do not fit the GPU inventory (None: they fit, or the spec runs on CPUs)."""
        if self.gpus is None:
            return None
        need = self.world_gpus(counts)
        if need <= len(self.gpus.devices):
            return None
        return (f"{need} GPUs needed ({self._parts(counts)}) but the inventory gpus.devices has "
                f"{len(self.gpus.devices)} ({self.gpus.devices}); add devices, or run fewer instances or a smaller tp")

    def blue_green_shortage(self, running: "DeploymentSpec") -> str | None:
        """Why this revision's world cannot start beside `running`'s (None: it fits, or the worlds run on CPUs):
        until the old world has drained both hold their GPUs."""
        if self.gpus is None:
            return None
        new, old = self.world_gpus(self.counts()), running.world_gpus(running.counts())
        if new + old <= len(self.gpus.devices):
            return None
        return (f"the new world ({self._parts(self.counts())}: {new} GPUs) starts beside the running one "
                f"({running._parts(running.counts())}: {old} GPUs) until that one drains: {new + old} GPUs needed, "
                f"but gpus.devices has {len(self.gpus.devices)} ({self.gpus.devices}); add devices, or change less "
                f"at once (`trtpd down` then `trtpd up` restarts with no room needed, ending what is in flight)")

    def engine_dir(self, role: str) -> Path:
        override = getattr(self.engines, role)
        if override is not None:
            return override
        return self.engines.build_root / engine_folder_name(role, self.role(role).tp)

    def role_shapes(self) -> dict[str, RoleShape]:
        return {role: self._shape(role) for role in self.role_names}

    def _shape(self, role: str) -> RoleShape:
        spec, engine = self.role(role), self.engine_dir(role)
        config, manifest = engine / "config.json", engine / "manifest.json"
        for path in (manifest,) if self.gpus is not None else (config, manifest):   # a GPU build: manifests only
            if not path.is_file():
                raise ConfigError(f"{engine}: no {role} engine here ({path.name} missing; deployment {self.name}, "
                                  f"engines.{role if getattr(self.engines, role) else 'build_root'}); build it with "
                                  f"`trtpd build --backend {self.backend} --model {self.model}` or fix the path")
        layout = load_manifest(engine).kv_layout()
        kv_signature = _digest([layout.dtype.value, layout.num_layers, layout.num_kv_heads, layout.head_size,
                                layout.tokens_per_block, layout.scales_digest])
        restart = {"engine_dir": str(engine), "config": None if self.gpus is not None else _file_digest(config),
                   "manifest": _file_digest(manifest), "kv_transport": self.kv_transport,
                   "kv_transfer_timeout_ms": self.kv_transfer_timeout_ms,
                   "gpus_per_instance": self.gpus_per_instance(role),
                   **{name: getattr(spec, name) for name in RESTART_FIELDS if name != "gpus_per_instance"},
                   **self._serve_restart(role)}
        on_gpus = {} if self.gpus is None else {"gpu_ids": tuple(self.gpus.devices),
                                                "serve_dir": str(self.serve_dir()),
                                                "serve_command": tuple(shlex.split(self.gpus.serve_command))}
        return RoleShape(role=role, engine_dir=str(engine), config_hash=_digest(restart), kv_signature=kv_signature,
                         cpus_per_instance=spec.cpus_per_instance, gpus_per_instance=self.gpus_per_instance(role),
                         tp=spec.tp, max_batch_size=spec.max_batch_size, kv_transport=self.kv_transport,
                         kv_transfer_timeout_ms=self.kv_transfer_timeout_ms, step_delay_ms=spec.step_delay_ms,
                         backend=self.backend, **on_gpus)

    def _serve_restart(self, role: str) -> dict:
        """On GPUs, what the worker is besides its engine: the serve folder, the command, and the rendered command
        line and options (an in-place rebuild restarts the role). The inventory is not here: a new one applies to
        the next starts."""
        if self.gpus is None:
            return {}
        folder = self.serve_dir()
        digests = {name: _file_digest(folder / name) if (folder / name).is_file() else None
                   for name in ("launch.sh", f"{role}.yaml")}
        return {"serve_dir": str(folder), "serve_command": self.gpus.serve_command, "serve_files": digests}

    def routing_policy(self) -> RoutingPolicy:
        return RoutingPolicy(**self.routing.model_dump())

    def reference_deployment(self, role_engine_overrides: dict[str, Path] | None = None) -> ReferenceDeployment:
        """The reference backend's deployment of this spec (max_batch_size: the largest over its roles)."""
        if self.backend != "reference":
            raise ConfigError(f"deployment {self.name}: backend {self.backend} has no reference deployment")
        engines = {role: Path(p).resolve() for role, p in (role_engine_overrides or {}).items()}
        for role in self.role_names:
            engines.setdefault(role, self.engine_dir(role))
        build_root = self.engines.build_root or engines[self.role_names[0]].parent
        if "colocated" in engines and engines["colocated"] != build_root / "colocated-tp1":
            if engines["colocated"].name != "colocated-tp1":
                raise ConfigError(f"{engines['colocated']}: a colocated engine must be a folder named colocated-tp1 "
                                  f"(ReferenceDeployment finds it under its build root)")
            build_root = engines["colocated"].parent
        counts = self.counts()
        return ReferenceDeployment(
            build_root=build_root, mode=self.mode, kv_transport=self.kv_transport,
            prefill_instances=counts.get("prefill", 1), decode_instances=counts.get("decode", 1),
            colocated_instances=counts.get("colocated", 2), kv_transfer_timeout_ms=self.kv_transfer_timeout_ms,
            max_batch_size=max(self.role(r).max_batch_size for r in self.role_names),
            prefill_engine=engines.get("prefill"), decode_engine=engines.get("decode"))

    def spec_json(self) -> dict:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return HEADER + dump_yaml(self.spec_json())


# -- resolution and the checks that span fields ---------------------------------------------------
def _resolve(spec: DeploymentSpec, base_dir: Path, trust_resolved: bool) -> list[Problem]:
    """Fills in what the file leaves to defaults or the plan; returns the problems (loc, message)."""
    problems: list[Problem] = []
    for field in ("build_root", *ROLES):
        path = getattr(spec.engines, field)
        if path is not None:
            setattr(spec.engines, field, (base_dir / Path(path).expanduser()).resolve())
    if spec.plan is not None:
        spec.plan = (base_dir / spec.plan.expanduser()).resolve()
    problems += _check_roles(spec)
    if problems:
        return problems
    roles = spec.role_names
    if spec.plan is not None and not (trust_resolved and all(spec.role(r).instances is not None for r in roles)):
        problems += _apply_plan(spec)
    for role in roles:
        spec.role(role).instances = 1 if spec.role(role).instances is None else spec.role(role).instances
        spec.role(role).tp = spec.role(role).tp or 1
    transports = KV_TRANSPORTS[spec.backend]
    spec.kv_transport = spec.kv_transport or DEFAULT_KV_TRANSPORT[spec.backend]
    if spec.kv_transport not in transports:
        why = (" (Triton's tensorrtllm backend hard-codes CacheTransceiverConfig(MPI); UCX or NIXL need backend "
               "trtllm-serve)") if spec.backend == "tensorrt-llm" else ""
        problems.append((("kv_transport",), f"{spec.kv_transport!r} is not a {spec.backend} KV transport; "
                                            f"use one of {', '.join(transports)}{why}"))
    for role in roles:
        problems += _check_role(spec, role)
    for role in ROLES:
        if role not in roles and getattr(spec.engines, role) is not None:
            problems.append((("engines", role), f"mode {spec.mode} has no {role} role; remove this override"))
    if spec.worlds:
        problems += _check_worlds(spec, base_dir)
    if spec.kubernetes is not None and not problems:
        problems += _check_kubernetes(spec, base_dir)
    if spec.gpus is not None and not problems and not spec.worlds:
        problems += _check_gpus(spec, base_dir, trust_resolved)
    return problems + _check_autoscaling(spec)


def _check_worlds(spec: DeploymentSpec, base_dir: Path) -> list[Problem]:
    """backend tensorrt-llm (one world per revision): context/generation disaggregation, what a world cannot do,
    and on GPUs an inventory the first world fits."""
    problems = []
    if spec.mode != "disaggregated":
        problems.append((("mode",), f"{spec.mode}: a Triton MPI world (backend tensorrt-llm) holds context and "
                                    f"generation instances; use mode disaggregated, or backend reference"))
    if spec.autoscaling.enabled:
        problems.append((("autoscaling", "enabled"), "the autoscaler changes instance counts in place; on backend "
                                                     "tensorrt-llm new counts are a new world (`trtpd scale` "
                                                     "rolls one out), so set enabled: false"))
    if spec.gpus is not None and not problems:
        problems += _check_inventory(spec, base_dir)
        for role in spec.role_names:
            if spec.role(role).step_delay_ms:
                problems.append((("roles", role, "step_delay_ms"), "the CPU stand-in's fault injection; the "
                                                                   "tensorrtllm backend has no such setting (set 0)"))
        shortage = None if problems else spec.gpu_shortage(spec.counts())
        if shortage:
            problems.append((("gpus", "devices"), f"the first world does not fit: {shortage}"))
    return problems


def _check_inventory(spec: DeploymentSpec, base_dir: Path) -> list[Problem]:
    """gpus.devices resolved (auto: nvidia-smi) and valid; gpus.serve_dir resolved against the spec's folder."""
    from trtpd.fleet.gpus import GpuInventory, detect_gpus
    g = spec.gpus
    try:
        g.devices = list(detect_gpus()) if g.devices == "auto" else g.devices
        GpuInventory(tuple(g.devices))
    except ConfigError as exc:
        return [(("gpus", "devices"), str(exc))]
    if not g.devices or min(g.devices) < 0:
        return [(("gpus", "devices"), f"{g.devices}: give device ids (0, 1, ...) as nvidia-smi numbers them")]
    if g.serve_dir is not None:
        g.serve_dir = (base_dir / g.serve_dir.expanduser()).resolve()
    return []


def _check_kubernetes(spec: DeploymentSpec, base_dir: Path) -> list[Problem]:
    """The kubernetes section: one way to reach the API, engines and tokenizer inside the pods' mount."""
    from trtpd.controller.k8s.manifests import DEFAULT_IMAGE, NAME_RE

    k, problems = spec.kubernetes, []
    for field in ("token_file", "ca_file", "kubeconfig"):
        if getattr(k, field) is not None:
            setattr(k, field, (base_dir / getattr(k, field).expanduser()).resolve())
    k.image = k.image or DEFAULT_IMAGE
    if spec.backend != "trtllm-serve":
        problems.append((("backend",), f"{spec.backend}: the Kubernetes executor runs one trtllm-serve worker per "
                                       f"pod; use backend: trtllm-serve (or drop the kubernetes section)"))
    if spec.kv_transport not in ("ucx", "nixl"):
        problems.append((("kv_transport",), f"{spec.kv_transport!r}: trtllm-serve pods move KV with "
                                            f"cache_transceiver_config.backend ucx or nixl"))
    if not NAME_RE.match(spec.name):
        problems.append((("name",), f"{spec.name!r}: on Kubernetes it prefixes Service names (DNS-1035 labels): "
                                    f"1-40 lower-case letters, digits and '-', starting with a letter"))
    problems += _check_kubernetes_api(k)
    mount = k.engines.mount_path
    if bool(k.engines.pvc_name) == bool(k.engines.host_path):
        problems.append((("kubernetes", "engines"), "give exactly one of pvc_name (a PersistentVolumeClaim) or "
                                                    "host_path (a folder on every GPU node)"))
    if not mount.is_absolute():
        problems.append((("kubernetes", "engines", "mount_path"), f"{mount}: an absolute path (inside the pods)"))
        return problems
    for role in spec.role_names:
        if not spec.engine_dir(role).is_relative_to(mount):
            where = ("engines", role) if getattr(spec.engines, role) is not None else ("engines", "build_root")
            problems.append((where, f"{spec.engine_dir(role)} is not under kubernetes.engines.mount_path {mount}: "
                                    f"pods read the engines at the path the spec names; build into the volume "
                                    f"(trtpd build --engines-dir {mount}) or mount it where the engines are"))
    if k.model_path is not None and not k.model_path.is_absolute():
        k.model_path = (base_dir / k.model_path).resolve()
    if k.model_path is not None and not k.model_path.is_relative_to(mount):
        problems.append((("kubernetes", "model_path"), f"{k.model_path} is not under {mount}"))
    return problems


def _check_gpus(spec: DeploymentSpec, base_dir: Path, trust_resolved: bool) -> list[Problem]:
    """The gpus section: trtllm-serve on this machine, an inventory the initial instances fit, and roles whose tp
    is the one serve-pytorch/launch.sh starts (read once when the spec is applied; a stored revision is trusted)."""
    g, problems = spec.gpus, []
    if spec.backend != "trtllm-serve" or spec.kubernetes is not None:
        return [(("gpus",), f"real workers on this machine's GPUs are trtllm-serve's or Triton MPI worlds (backend "
                            f"{spec.backend}{', with a kubernetes section' if spec.kubernetes else ''}); use backend: "
                            f"trtllm-serve or tensorrt-llm without a kubernetes section, or drop gpus")]
    if spec.mode != "disaggregated":
        return [(("gpus",), "serve-pytorch/ renders context and generation workers: use mode disaggregated")]
    problems = _check_inventory(spec, base_dir)
    if problems:
        return problems
    for role in spec.role_names:
        if spec.role(role).step_delay_ms:
            problems.append((("roles", role, "step_delay_ms"), "the CPU twin's fault injection; real trtllm-serve "
                                                               "workers have no such flag (set it to 0)"))
    shortage = spec.gpu_shortage(spec.counts())
    if shortage:
        problems.append((("gpus", "devices"), f"the initial instances do not fit: {shortage}"))
    scaling = spec.autoscaling
    if scaling.enabled:
        most = {r: scaling.max.get(r, spec.role(r).instances) for r in spec.role_names}
        budget = scaling.budget_gpus if scaling.budget_gpus is not None else \
            sum(n * spec.gpus_per_instance(r) for r, n in most.items())
        if budget > len(g.devices):
            problems.append((("autoscaling", "budget_gpus"), f"the autoscaler may hold {budget} GPUs, more than the "
                                                             f"{len(g.devices)} of gpus.devices; set budget_gpus to "
                                                             f"at most {len(g.devices)} (or lower autoscaling.max)"))
    return problems + ([] if trust_resolved else _check_serve_dir(spec))


def _check_serve_dir(spec: DeploymentSpec) -> list[Problem]:
    from trtpd.fleet.gpu_workers import load_gpu_workers
    where = ("gpus", "serve_dir") if spec.gpus.serve_dir is not None else ("engines", "build_root")
    try:
        command = shlex.split(spec.gpus.serve_command)
        workers = load_gpu_workers(spec.serve_dir(), command)
        roles = {role: workers.role(role) for role in spec.role_names}
    except (ConfigError, ValueError) as exc:
        loc = ("gpus", "serve_command") if "serve command" in str(exc) or isinstance(exc, ValueError) else where
        return [(loc, str(exc))]
    problems = []
    for role, worker in roles.items():
        if worker.gpus_per_instance != spec.gpus_per_instance(role):
            flags = dict(worker.args)
            tp, pp = flags.get("--tp_size", 1), flags.get("--pp_size", 1)
            problems.append((("roles", role, "tp"), f"{spec.role(role).tp} (gpus_per_instance "
                             f"{spec.gpus_per_instance(role)}), but {workers.serve_dir}/launch.sh starts the {role} "
                             f"worker with --tp_size {tp} --pp_size {pp}; make them equal (or rebuild with trtpd "
                             f"build --{role}-tp)"))
    return problems


def _check_kubernetes_api(k: KubernetesSpec) -> list[Problem]:
    problems = []
    if k.api_server is not None and not k.api_server.startswith(("https://", "http://")):
        problems.append((("kubernetes", "api_server"), f"{k.api_server!r}: a URL, https://HOST:PORT"))
    if k.api_server is not None and k.in_cluster:
        problems.append((("kubernetes", "in_cluster"), "true with api_server set: give one of them"))
    for field in ("kubeconfig", "context"):
        if getattr(k, field) is not None and (k.api_server is not None or k.in_cluster):
            problems.append((("kubernetes", field), "only without api_server and in_cluster (it picks a kubeconfig "
                                                    "entry); drop one"))
    for field in ("token_file", "ca_file"):
        if getattr(k, field) is not None and k.api_server is None:
            problems.append((("kubernetes", field), "needs kubernetes.api_server (a kubeconfig or the in-cluster "
                                                    "service account carries its own)"))
    return problems


def _check_roles(spec: DeploymentSpec) -> list[Problem]:
    problems = []
    for role in ROLES:
        given = getattr(spec.roles, role) is not None
        if role in spec.role_names and not given:
            problems.append((("roles", role), f"mode {spec.mode} needs a roles.{role} entry, e.g. "
                                              f"`{role}: {{instances: 1}}` (roles: {', '.join(spec.role_names)})"))
        elif given and role not in spec.role_names:
            problems.append((("roles", role), f"mode {spec.mode} has no {role} role; remove it "
                                              f"(roles: {', '.join(spec.role_names)})"))
    return problems


def _apply_plan(spec: DeploymentSpec) -> list[Problem]:
    if spec.mode != "disaggregated":
        return [(("plan",), f"a plan sizes prefill and decode; mode {spec.mode} cannot take one")]
    try:
        plan: Plan = load_plan(spec.plan)
    except ConfigError as exc:
        return [(("plan",), str(exc))]
    problems = []
    for role in spec.role_names:
        block, mine = getattr(plan, role), spec.role(role)
        if block is None:
            problems.append((("plan",), f"{spec.plan} has no {role} block (an infeasible plan?)"))
            continue
        for field, planned in (("instances", block.num_instances), ("tp", block.tp)):
            given = getattr(mine, field)
            if given is None:
                setattr(mine, field, planned)
            elif given != planned:
                plan_field = "num_instances" if field == "instances" else "tp"
                problems.append((("roles", role, field), f"{given} differs from {planned}, the plan {spec.plan}'s "
                                                         f"{role}.{plan_field}; remove roles.{role}.{field} (the "
                                                         f"plan decides) or make them equal"))
    return problems


def _check_role(spec: DeploymentSpec, role: str) -> list[Problem]:
    mine, problems = spec.role(role), []
    if spec.mode == "disaggregated" and mine.instances < 1:
        problems.append((("roles", role, "instances"), "Input should be greater than or equal to 1 (mode "
                         "disaggregated cannot scale a role to zero: with no prefill or no decode instance no "
                         "request is served)"))
    # on Kubernetes or with a GPU inventory: real trtllm-serve
    on_cpus = spec.backend in CPU_BACKENDS and spec.kubernetes is None and spec.gpus is None
    if on_cpus and mine.tp != 1:
        source = f" (from the plan {spec.plan})" if spec.plan else ""
        gpus = "" if spec.backend == "reference" else " (a gpus section runs it on this machine's GPUs)"
        problems.append((("roles", role, "tp"), f"the {spec.backend} backend runs the reference engines here, tp 1 "
                                                f"only; got {mine.tp}{source}; use a plan with tp 1{gpus}"))
    if on_cpus and mine.gpus_per_instance:
        problems.append((("roles", role, "gpus_per_instance"), f"the {spec.backend} backend runs on CPUs here (the "
                                                               f"controller starts trtllm-serve's CPU twin); set 0"))
    if getattr(spec.engines, role) is None and spec.engines.build_root is None:
        problems.append((("engines",), f"no engine for {role}: give engines.build_root or engines.{role}"))
    return problems


def _check_autoscaling(spec: DeploymentSpec) -> list[Problem]:
    scaling, problems = spec.autoscaling, []
    for bound in ("min", "max"):
        for role in getattr(scaling, bound):
            if role not in spec.role_names:
                problems.append((("autoscaling", bound, role), f"mode {spec.mode} has no {role} role "
                                                               f"(roles: {', '.join(spec.role_names)})"))
    floor = 1 if spec.mode == "disaggregated" else 0
    for role in spec.role_names:
        low = scaling.min.setdefault(role, 1)
        high = scaling.max.setdefault(role, spec.role(role).instances)
        if low < floor:
            problems.append((("autoscaling", "min", role), f"Input should be greater than or equal to {floor} "
                                                           f"(mode {spec.mode} cannot scale a role to zero)"))
        if low > high:
            problems.append((("autoscaling", "max", role), f"max {high} < min {low}"))
        elif scaling.enabled and not low <= spec.role(role).instances <= high:
            problems.append((("roles", role, "instances"), f"{spec.role(role).instances} is outside the "
                                                           f"autoscaling bounds [{low}, {high}] for {role}"))
    if scaling.enabled:
        for budget, per_instance in (("budget_cpus", lambda r: spec.role(r).cpus_per_instance),
                                     ("budget_gpus", spec.gpus_per_instance)):
            limit = getattr(scaling, budget)
            need = {r: spec.role(r).instances * per_instance(r) for r in spec.role_names}
            if limit is not None and sum(need.values()) > limit:
                parts = " + ".join(f"{r} {spec.role(r).instances}x{per_instance(r)}" for r in spec.role_names)
                problems.append((("autoscaling", budget), f"the roles need {sum(need.values())} ({parts}), more "
                                                          f"than {budget} {limit}"))
    return problems


# -- loading with file:line:field errors ----------------------------------------------------------
def load_spec(path: Path | str) -> DeploymentSpec:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such deployment spec")
    return parse_spec(path.read_text(), str(path), base_dir=path.parent)


def parse_spec(text: str, source: str, base_dir: Path | None = None) -> DeploymentSpec:
    """Relative paths resolve against base_dir (default: the folder of `source`)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{source}{line}: not valid YAML ({exc.problem or exc.context}); fix the syntax") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({exc}); fix the syntax") from None
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of fields (api_version, kind, name, ...), "
                          f"got {type(data).__name__}")
    duplicate = _first_duplicate(root, ())
    if duplicate:
        raise ConfigError(f"{source}:{duplicate[1]}: {_dotted(duplicate[0])}: duplicate key (first at line "
                          f"{duplicate[2]}); keep one")
    problems: list[Problem] = []
    base = Path(base_dir) if base_dir is not None else Path(source).parent
    try:
        spec = DeploymentSpec.model_validate(data, context={"base_dir": base, "problems": problems})
    except ValidationError as exc:
        problems = [(err["loc"], err["msg"]) for err in exc.errors()]
    if problems:
        raise ConfigError("\n".join(f"{source}:{_line_of(root, loc)}: {_dotted(loc) or '(top level)'}: {msg}"
                                    for loc, msg in problems))
    return spec


def _dotted(loc: tuple) -> str:
    return ".".join(str(part) for part in loc if not (isinstance(part, str) and "[" in part))


def _line_of(root: yaml.Node, loc: tuple) -> int:
    """1-based line of the deepest node of `loc` in the YAML (a key's own line; a missing key: its parent's)."""
    node, line = root, root.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)),
                         None)
            if match is None:
                break
            node, line = match[1], match[0].start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        elif not (isinstance(part, str) and "[" in part):   # pydantic's union tags: not in the YAML
            break
    return line


def _first_duplicate(node: yaml.Node, loc: tuple) -> tuple[tuple, int, int] | None:
    """(loc, line, first line) of the first key given twice in one mapping (YAML keeps the last silently)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key.start_mark)
            if name in seen:
                return loc + (name,), key.start_mark.line + 1, seen[name]
            seen[name] = key.start_mark.line + 1
            found = _first_duplicate(value, loc + (name,))
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found = _first_duplicate(item, loc + (index,))
            if found:
                return found
    return None


# -- what a revision changes ----------------------------------------------------------------------
@dataclass(frozen=True)
class SpecChange:
    field: str        # dotted path in the spec, e.g. roles.decode.instances
    old: object
    new: object
    effect: str       # restart:<role> | scale:<role> | restart:gateway | in_place


def diff_specs(old: DeploymentSpec, new: DeploymentSpec,
               old_shapes: dict[str, RoleShape] | None = None) -> list[SpecChange]:
    """Every changed field and its effect; a field that restarts several roles gives one change per role.
    An engine rebuilt in place (same folder, other config.json or manifest.json) is invisible in the specs: pass
    the role shapes recorded when `old` was applied, and such a role shows as `engines.<role>.content`."""
    old_leaves, new_leaves = _leaves(old.spec_json()), _leaves(new.spec_json())
    changes = []
    for path in [*old_leaves, *(p for p in new_leaves if p not in old_leaves)]:
        before, after = old_leaves.get(path), new_leaves.get(path)
        if before != after:
            changes += [SpecChange(path, before, after, effect) for effect in _effects(path, old, new)]
    if old_shapes is None:
        return changes
    restarted, new_shapes = {c.effect for c in changes}, new.unit_shapes()
    for role in (r for r in new.unit_names if r in old_shapes):
        if f"restart:{role}" not in restarted and old_shapes[role].config_hash != new_shapes[role].config_hash:
            changes.append(SpecChange(f"engines.{role}.content", old_shapes[role].config_hash,
                                      new_shapes[role].config_hash, f"restart:{role}"))
    return changes


def _effects(path: str, old: DeploymentSpec, new: DeploymentSpec) -> list[str]:
    effects = _role_effects(path, old, new)
    if old.worlds or new.worlds:    # a world holds every role: what restarts or scales a role is a new world
        return sorted({f"restart:{WORLD}" if e.startswith(("restart:", "scale:")) and e != "restart:gateway" else e
                       for e in effects})
    return effects


def _role_effects(path: str, old: DeploymentSpec, new: DeploymentSpec) -> list[str]:
    parts = path.split(".")
    both = [r for r in ROLES if r in old.role_names or r in new.role_names]
    if parts[0] == "roles" and len(parts) > 1:
        role = parts[1]
        if role not in old.role_names or role not in new.role_names:
            return [f"restart:{role}"]
        return [f"scale:{role}" if parts[-1] == "instances" else f"restart:{role}"]
    if parts[0] in ALL_ROLES_RESTART or (parts[0] == "gpus" and parts[-1] != "devices"):
        return [f"restart:{r}" for r in both]     # gpus.serve_dir, gpus.serve_command, the section added or removed
    if parts[0] == "engines":
        moved = [r for r in both if r not in old.role_names or r not in new.role_names
                 or old.engine_dir(r) != new.engine_dir(r)]
        return [f"restart:{r}" for r in moved] or ["in_place"]
    if parts[0] == "gateway" and parts[-1] in ("host", "port"):
        return ["restart:gateway"]
    return ["in_place"]      # routing, slo, gateway limits, autoscaling, rollout, plan (its counts are roles.*)


def _leaves(data: object, prefix: str = "") -> dict[str, object]:
    if isinstance(data, dict):
        out: dict[str, object] = {}
        for key, value in data.items():
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def changed_roles(old: DeploymentSpec, new: DeploymentSpec,
                  old_shapes: dict[str, RoleShape] | None = None) -> tuple[str, ...]:
    """Units (roles, or the world) whose instances a rollout from old to new replaces (config_hash differs, or the
    unit is new/gone). old_shapes: the unit shapes recorded when `old` was applied (default: `old`'s engines as
    they are now)."""
    old_shapes, new_shapes = old_shapes if old_shapes is not None else old.unit_shapes(), new.unit_shapes()
    return tuple(r for r in UNITS if (r in old_shapes or r in new_shapes) and (
        r not in old_shapes or r not in new_shapes or old_shapes[r].config_hash != new_shapes[r].config_hash))


def _check_world_build(spec: DeploymentSpec, label: str) -> list[str]:
    """Triton worlds on GPUs are rendered from the build's deploy/ folder (trtpd/trtllm/world.py): it must be a
    finished tensorrt-llm build whose engines take the GPUs per instance the spec counts."""
    from trtpd.trtllm.world import read_build
    try:
        build = read_build(spec.serve_dir())
    except ConfigError as exc:
        return [f"{label}: gpus.serve_dir: {exc}"]
    return [f"{label}: roles.{role}: {spec.gpus_per_instance(role)} GPUs per instance, but the {role} engine "
            f"{build.deploy_dir} serves is built for tp x pp = {build.gpus_per_instance(role)}; make them equal"
            for role in spec.role_names if build.gpus_per_instance(role) != spec.gpus_per_instance(role)]


def _check_autoscaler(spec: DeploymentSpec, label: str) -> list[str]:
    """An autoscaler acts only on a model of the instances it scales (trtpd/autoscale/live.py): built here, so a
    spec without one is refused when it is applied, not when the controller first decides."""
    from trtpd.autoscale.live import live_autoscaler
    try:
        live_autoscaler(spec)
    except (ConfigError, ValueError) as exc:
        return [f"{label}: {exc}"]
    return []


def check_revision(new: DeploymentSpec, old: DeploymentSpec | None = None, *, revision: int = 0,
                   old_revision: int = 0, old_shapes: dict[str, RoleShape] | None = None) -> list[str]:
    """Problems that forbid applying `new` (after `old`): engines that cannot exchange KV, within the new revision
    and, during a rollout, between a changed role of the new revision and an unchanged role of the old one."""
    label = f"revision {revision}" if revision else "the new revision"
    old_label = f"revision {old_revision}" if old_revision else "the running revision"
    problems = []
    if old is not None and old.name != new.name:
        problems.append(f"{label}: name {new.name!r} differs from {old_label}'s {old.name!r}; a revision cannot "
                        f"rename a deployment (apply it as a new deployment)")
    if old is not None and old.kubernetes != new.kubernetes:
        problems.append(f"{label}: its kubernetes section differs from {old_label}'s; a revision cannot move a "
                        f"deployment or change its cluster settings (`trtpd down`, then `trtpd up -f`)")
    for role in new.role_names:
        try:
            built_for = load_manifest(new.engine_dir(role)).model.name
        except ConfigError as exc:
            problems.append(f"{label}: {role}: {exc}")
            continue
        if built_for != new.model:
            problems.append(f"{label}: {role} engine {new.engine_dir(role)} was built for model {built_for}, "
                            f"the spec says {new.model}")
    if not problems and new.autoscaling.enabled:
        problems += _check_autoscaler(new, label)
    if not problems and new.worlds and new.gpus is not None:
        problems += _check_world_build(new, label)
    if problems or new.mode != "disaggregated":
        return problems
    problems += [f"{label}: prefill vs decode: {p}" for p in check_pair(new.engine_dir("prefill"),
                                                                        new.engine_dir("decode"))]
    if old is None or old.mode != "disaggregated":
        return problems
    try:
        changed = changed_roles(old, new, old_shapes)
    except ConfigError as exc:
        return problems + [f"{old_label}: {exc}"]
    for kept, moved in (("prefill", "decode"), ("decode", "prefill")):
        if kept in changed or moved not in changed:
            continue
        engines = {kept: old.engine_dir(kept), moved: new.engine_dir(moved)}
        for p in check_pair(engines["prefill"], engines["decode"]):
            problems.append(f"{label} changes {moved} and keeps {kept} of {old_label}: during the rollout {moved} "
                            f"({label}) and {kept} ({old_label}) exchange KV: {p}")
    return problems


def _digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
