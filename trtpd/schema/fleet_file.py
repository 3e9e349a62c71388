"""fleet.json, the part every reader shares: the instances as the gateway routes to them, and the controller's
word to the gateway (drains, the canary split, the routing policy). One model for its three codecs: the local
fleet writes it (trtpd/fleet/records.py, which adds the host-control fields: server pids and ports, cores, KV
binds), the Kubernetes executor writes it into a ConfigMap (trtpd/controller/k8s/fleet_file.py, paths inside the
pods), and the gateway reads it (trtpd/gateway/config.py). The field names are an interface: they are defined
here only. A reader ignores the fields it does not share (a local fleet's host-control fields)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

ROUTED_ROLES = ("prefill", "decode", "colocated")     # an "entry" instance (the Triton ensemble) is not routed to
# how the gateway speaks to an instance: Triton's KServe gRPC stream to a role model (grpc_url), or trtllm-serve's
# OpenAI HTTP with disaggregated_params (http_url; trtpd/transports/trtllm_http.py)
PROTOCOLS = ("triton-grpc", "trtllm-serve")


@dataclass(frozen=True)
class RoutedInstance:
    name: str                    # e.g. "prefill-0"; also the `instance` metrics label
    role: str                    # prefill | decode | colocated | entry
    model: str                   # the model name the instance serves (Triton: the role model's)
    grpc_url: str                # host:port
    metrics_url: str
    max_input_len: int
    max_seq_len: int
    max_batch_size: int = 0      # (routing reads it from the instance's metrics; kept for the record)
    http_url: str = ""
    revision: int = 0            # the controller's revision it runs (0: a fleet started without a controller)
    admin_state: str = "ready"   # ready | draining: the controller's word to the gateway (no new requests)
    kv_advertise: str = ""       # prefill: its KV exporter's host:port (give-ups by request id go there)
    protocol: str = "triton-grpc"   # one of PROTOCOLS
    # the Triton MPI world serving this endpoint (backend tensorrt-llm; "" elsewhere): one server holds a world's
    # prefill and decode models and its KV moves over MPI inside it, so a request's prefill and decode share a world
    world: str = ""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"instance {self.name!r}: protocol {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RoutedInstance":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class FleetFile:
    name: str
    mode: str                    # disaggregated | colocated
    key_file: str                # the deployment key (0600): orchestrator tokens, KV handles, the admin token
    tokenizer_dir: str           # the checkpoint folder holding the tokenizer
    instances: tuple[RoutedInstance, ...] = ()
    build_root: str = ""         # the engines' folder (as the writer sees it)
    traffic: dict | None = None  # TrafficSplit fields (canary revision, share, changed roles); None: no canary
    routing: dict | None = None  # RoutingPolicy fields; None: the gateway's default
    gateway: dict | None = None  # where the fleet's gateway listens: {"host", "port", ...} (the Triton entry sends
                                 # its requests there; locally also its process: pid, start time, log, key file)

    @property
    def routed(self) -> tuple[RoutedInstance, ...]:
        return tuple(i for i in self.instances if i.role in ROUTED_ROLES)

    @property
    def routed_traffic(self) -> dict | None:
        """The canary split in the gateway's terms (worlds' endpoints where the controller names worlds)."""
        worlds: dict[str, list[str]] = {}
        for i in self.instances:
            if i.world:
                worlds.setdefault(i.world, []).append(i.role)
        return world_traffic(self.traffic, worlds)

    @property
    def draining(self) -> frozenset[str]:
        return frozenset(i.name for i in self.instances if i.admin_state == "draining")

    def to_dict(self) -> dict:
        return {"name": self.name, "mode": self.mode, "build_root": self.build_root, "key_file": self.key_file,
                "tokenizer_dir": self.tokenizer_dir, "instances": [i.to_dict() for i in self.instances],
                "traffic": self.traffic, "routing": self.routing, "gateway": self.gateway}

    @classmethod
    def from_dict(cls, data: dict) -> "FleetFile":
        return cls(data["name"], data["mode"], data["key_file"], data["tokenizer_dir"],
                   tuple(RoutedInstance.from_dict(i) for i in data["instances"]), data.get("build_root", ""),
                   data.get("traffic"), data.get("routing"), data.get("gateway"))


def read_fleet_file(path: "str | Path") -> FleetFile:
    """Raises OSError or ValueError (not JSON, a field missing) for the caller to name."""
    try:
        return FleetFile.from_dict(json.loads(Path(path).read_text()))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a fleet file ({type(exc).__name__}: {exc})") from None


WORLD = "world"    # the controller's unit on backend tensorrt-llm (trtpd/controller/types.py)


def world_endpoint(world: str, role: str) -> str:
    """The name the gateway routes to for `role`'s model in world `world` (also its `instance` metrics label)."""
    return f"{world}.{role}"


def world_traffic(traffic: dict | None, worlds: dict[str, list[str]]) -> dict | None:
    """The controller's canary split in the gateway's terms. The controller splits worlds (changed role "world",
    the canary's world names); the gateway routes to the worlds' endpoints, so the changed roles become the roles
    the worlds hold and each canary world its endpoints. `worlds`: {world name: its roles}."""
    if not traffic or WORLD not in traffic.get("changed_roles", ()):
        return traffic
    held = {role for roles in worlds.values() for role in roles}
    canary = [world_endpoint(w, role) for w in traffic.get("canary_instances", ()) for role in worlds.get(w, ())]
    return {**traffic, "changed_roles": [r for r in ROUTED_ROLES if r in held],
            "canary_instances": sorted(canary)}
