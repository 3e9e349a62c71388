"""fleet.json: the one record of what a deployment runs, where, and with which keys (owner-only, 0600).

Every bring-up writes it: a fleet (`trtpd up --fleet`: one tritonserver per instance), a controller's deployment
(its local executor), and a single-server deployment (`trtpd up`: one instance of role "server", the tritonserver
that holds the role models and their ensemble). The part the gateway reads is trtpd/schema/fleet_file.py's
(FleetFile: the routed instances, drains, the canary split, the routing policy); this record adds what host-side
control needs (each server's pid, start time and ports, cores, KV binds, the gateway's and supervisord's
processes). Read by `trtpd down/status`, the controller's local executor and the gateway. (The controller's own
controller.db holds its decisions: revisions, the lifecycle it wants for each instance, the audit log.)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtpd.errors import TrtpdError
from trtpd.fleet.tritonserver import ServerProcess
from trtpd.schema.fleet_file import FleetFile, RoutedInstance, world_endpoint

FLEET_FILE = "fleet.json"
SERVER = "server"   # a single-server deployment's one tritonserver: role models, BLS and ensemble in one
# entry: the Triton ensemble in front of a fleet (optional)
ROLES = ("prefill", "decode", "colocated", "entry", SERVER)
MODES = ("disaggregated", "colocated")


def trtpd_home() -> Path:
    return Path(os.environ.get("TRTPD_HOME", ".trtpd")).resolve()


def deployment_dir(name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise TrtpdError(f"deployment name {name!r}: use letters, digits, '-' or '_'")
    return trtpd_home() / "deployments" / name


@dataclass
class InstanceRecord:
    name: str               # e.g. "prefill-0"; also the `instance` metrics label
    role: str               # prefill | decode | colocated
    model: str              # the model name inside its repository (= role)
    server: ServerProcess   # pid, start_time, host, ports, repo, log
    engine_dir: str
    kv_transport: str       # shm | tcp | ucx | mpi
    kv_bind: str            # host:port the KV exporter binds (prefill); "" for decode/colocated
    kv_advertise: str       # host:port put in the handles' endpoint; "" for decode/colocated
    cpus: list[int]
    max_batch_size: int     # from the engine's EngineConfig (routing and validation use them)
    num_kv_blocks: int
    max_input_len: int
    max_seq_len: int
    revision: int = 0           # the controller's revision it runs (0: a fleet started without a controller)
    admin_state: str = "ready"  # ready | draining: the controller's word to the gateway (no new requests)
    protocol: str = "triton-grpc"   # triton-grpc: a tritonserver; trtllm-serve: a worker (fleet/serve_workers.py)
    gpus: list[int] = field(default_factory=list)   # the GPUs it holds (CUDA_VISIBLE_DEVICES; fleet/gpus.py)
    world_roles: list[str] = field(default_factory=list)   # role "world": the role models its one server holds

    def endpoints(self) -> list[RoutedInstance]:
        """A world's role models as the gateway routes to them ("<world>.<role>", tagged with the world); an
        instance of one role is its own endpoint."""
        if not self.world_roles:
            return [self.routed()]
        return [RoutedInstance(world_endpoint(self.name, role), role, role, self.grpc_url, self.metrics_url,
                               self.max_input_len, self.max_seq_len, self.max_batch_size, self.http_url,
                               self.revision, self.admin_state, "", self.protocol, world=self.name)
                for role in self.world_roles]

    @property
    def grpc_url(self) -> str:
        return self.server.grpc_url

    @property
    def http_url(self) -> str:
        return self.server.http_url

    @property
    def metrics_url(self) -> str:
        return self.server.metrics_url

    def routed(self) -> RoutedInstance:
        """The instance as the gateway reads it."""
        return RoutedInstance(self.name, self.role, self.model, self.grpc_url, self.metrics_url, self.max_input_len,
                              self.max_seq_len, self.max_batch_size, self.http_url, self.revision, self.admin_state,
                              self.kv_advertise, self.protocol)

    def to_dict(self) -> dict:
        """The shared fields (FleetFile's), then this host's own."""
        return {**self.routed().to_dict(), "server": self.server.to_dict(), "engine_dir": self.engine_dir,
                "kv_transport": self.kv_transport, "kv_bind": self.kv_bind, "cpus": list(self.cpus),
                "num_kv_blocks": self.num_kv_blocks, "gpus": list(self.gpus), "world_roles": list(self.world_roles)}

    @classmethod
    def from_dict(cls, d: dict) -> "InstanceRecord":
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{**{k: v for k, v in d.items() if k in names}, "server": ServerProcess.from_dict(d["server"])})


@dataclass
class FleetRecord:
    name: str
    mode: str                       # disaggregated | colocated
    build_root: str
    key_file: str                   # the fleet's KV / orchestrator key (0600), shared by every instance
    tokenizer_dir: str              # the checkpoint folder holding the tokenizer
    instances: list[InstanceRecord] = field(default_factory=list)
    gateway: dict | None = None     # {"host", "port", "pid", "start_time", "log", "state_file", "api_key_file"}
    supervisor: dict | None = None  # supervisord running the gateway (and controller): {"pid", "start_time", ...}
    started_at: float = field(default_factory=time.time)
    # the controller's word to the gateway, read again whenever this file changes:
    traffic: dict | None = None     # TrafficSplit fields (canary revision, share, changed roles); None: no canary
    routing: dict | None = None     # RoutingPolicy fields; None: the gateway's default

    @property
    def folder(self) -> Path:
        return deployment_dir(self.name)

    @property
    def path(self) -> Path:
        return self.folder / FLEET_FILE

    @property
    def single_server(self) -> InstanceRecord | None:
        """The one tritonserver of a single-server deployment (None: this record is a fleet's)."""
        if len(self.instances) == 1 and self.instances[0].role == SERVER:
            return self.instances[0]
        return None

    def instance(self, name: str) -> InstanceRecord:
        for inst in self.instances:
            if inst.name == name:
                return inst
        raise TrtpdError(f"fleet {self.name!r} has no instance {name!r} "
                         f"(it has {', '.join(i.name for i in self.instances) or 'none'})")

    def fleet_file(self) -> FleetFile:
        """What the gateway reads of this record."""
        gateway = {k: v for k, v in (self.gateway or {}).items() if k != "new_api_key"} or None   # shown once
        return FleetFile(self.name, self.mode, self.key_file, self.tokenizer_dir,
                         tuple(e for i in self.instances for e in ((i.routed(),) if i.world_roles else ())
                               + tuple(i.endpoints())), build_root=self.build_root,
                         traffic=self.traffic, routing=self.routing, gateway=gateway)

    def to_dict(self) -> dict:
        """fleet.json: every instance's record; a world's also as its endpoints (derived, skipped when read back)."""
        endpoints = [e.to_dict() for i in self.instances if i.world_roles for e in i.endpoints()]
        return {**self.fleet_file().to_dict(), "instances": [i.to_dict() for i in self.instances] + endpoints,
                "supervisor": self.supervisor, "started_at": self.started_at}

    @classmethod
    def from_dict(cls, d: dict) -> "FleetRecord":
        return cls(d["name"], d["mode"], d["build_root"], d["key_file"], d["tokenizer_dir"],
                   [InstanceRecord.from_dict(i) for i in d["instances"] if not i.get("world")],
                   d.get("gateway"), d.get("supervisor"),
                   d["started_at"], d.get("traffic"), d.get("routing"))

    def save(self) -> None:
        """Atomically, 0600 (the folder is the owner's only, like a deployment's)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        tmp = self.path.with_name(f".{FLEET_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.to_dict(), indent=2))
        os.replace(tmp, self.path)


def load_record(name: str) -> FleetRecord:
    """The record of deployment `name`, a fleet's or a single server's."""
    path = deployment_dir(name) / FLEET_FILE
    if not path.is_file():
        raise TrtpdError(f"no deployment named {name!r}: {path} does not exist (see `trtpd status`)")
    try:
        return FleetRecord.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise TrtpdError(f"{path}: not a fleet record ({type(exc).__name__}: {exc}); "
                         f"stop its processes by hand and remove the file") from None


def load_fleet(name: str) -> FleetRecord:
    """The record of fleet `name` (a single-server deployment is refused: it has no instances to control)."""
    if not (deployment_dir(name) / FLEET_FILE).is_file():
        raise TrtpdError(f"no fleet named {name!r}: {deployment_dir(name) / FLEET_FILE} does not exist (start one "
                         f"with `trtpd up --fleet --name {name}`; see `trtpd status`)")
    record = load_record(name)
    if record.single_server is not None:
        raise TrtpdError(f"{name!r} is a single-server deployment, not a fleet; `trtpd down --name {name}` first, "
                         f"or choose another --name")
    return record


def has_record(name: str) -> bool:
    """Whether deployment `name` (a fleet or a single server) has a record."""
    return (deployment_dir(name) / FLEET_FILE).is_file()


def _kind(name: str) -> str | None:
    """"fleet", "single" or None (no record)."""
    if not has_record(name):
        return None
    return "single" if load_record(name).single_server is not None else "fleet"


def is_fleet(name: str) -> bool:
    return _kind(name) == "fleet"


def is_single_server(name: str) -> bool:
    return _kind(name) == "single"


def list_records() -> list[FleetRecord]:
    root = trtpd_home() / "deployments"
    return [load_record(p.parent.name) for p in sorted(root.glob(f"*/{FLEET_FILE}"))] if root.is_dir() else []


def list_fleets() -> list[FleetRecord]:
    return [r for r in list_records() if r.single_server is None]
