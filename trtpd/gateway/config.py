"""What a gateway serves: its fleet (from fleet.json), limits and SLOs; typed, built once at start."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trtpd.schema.fleet_file import FleetFile, read_fleet_file
from trtpd.schema.slo import Slo


@dataclass(frozen=True)
class InstanceTarget:
    name: str
    role: str
    model: str
    grpc_url: str
    metrics_url: str
    revision: int = 0
    kv_endpoint: str = ""            # prefill: the KV exporter's host:port (give-ups by request id go there)
    protocol: str = "triton-grpc"    # triton-grpc (grpc_url) | trtllm-serve (http_url): schema/fleet_file.py
    http_url: str = ""
    world: str = ""                  # the Triton MPI world serving it ("": none); KV moves only within one world


@dataclass(frozen=True)
class GatewayConfig:
    model_name: str                  # the name clients pass as `model` (the checkpoint's model)
    mode: str                        # "disaggregated" | "colocated"
    instances: tuple[InstanceTarget, ...]
    key_file: Path                   # the deployment key: orchestrator tokens for the role models
    tokenizer_dir: Path
    max_input_len: int
    max_seq_len: int
    eos_id: int = 2
    host: str = "127.0.0.1"
    port: int = 0
    api_keys: frozenset[str] = field(default_factory=frozenset)   # empty: no key required (--no-auth)
    max_inflight: int = 64           # requests served at once (the rest queue)
    max_queued: int = 256            # beyond this a request gets 429
    max_body_bytes: int = 1 << 20    # larger request bodies get 413
    max_buffered_chunks: int = 256   # a stream's chunks waiting for a client that does not read: beyond, cancelled
    default_max_tokens: int = 16     # OpenAI's default for completions; chat uses the room left, capped
    chat_max_tokens_cap: int = 256
    slo: Slo = field(default_factory=Slo)   # live goodput: requests meeting both TTFT and TPOT
    poll_interval_s: float = 0.2     # instance load probes
    wait_for_instance_s: float = 15.0   # a request finding no ready instance of a role waits this long (healing)
    fleet_file: Path | None = None   # re-read when it changes: instances added/removed, drains, canary, routing
    cluster_name: str = ""           # the disagg cluster trtllm-serve workers register in (cluster_store.py)


def checkpoint_facts(tokenizer_dir: Path) -> tuple[str, int]:
    """(model name, EOS id) from the checkpoint's config.json, without loading weights."""
    config = json.loads((Path(tokenizer_dir) / "config.json").read_text())
    return config.get("trtpd", {}).get("model") or Path(tokenizer_dir).parent.parent.name, \
        int(config.get("eos_token_id", 2))


def _read(path: Path) -> FleetFile:
    try:
        return read_fleet_file(path)
    except (OSError, ValueError) as exc:
        from trtpd.errors import TrtpdError
        raise TrtpdError(f"{path}: cannot read the fleet record ({exc}); is the fleet running?") from None


def from_fleet_file(path: Path, **overrides) -> GatewayConfig:
    """A GatewayConfig for the fleet described by a fleet.json (trtpd/schema/fleet_file.py: written by the local
    fleet or the Kubernetes executor; the gateway reads the file, not the fleet package, so the fleet may start
    the gateway without an import cycle)."""
    fleet = _read(Path(path))
    roles = fleet.routed
    instances = tuple(InstanceTarget(i.name, i.role, i.model, i.grpc_url, i.metrics_url, i.revision, i.kv_advertise,
                                     i.protocol, i.http_url, i.world) for i in roles)
    serving = [i for i in roles if i.role in ("decode", "colocated")] or roles
    name, eos = checkpoint_facts(Path(fleet.tokenizer_dir))
    overrides.setdefault("fleet_file", Path(path))
    return GatewayConfig(model_name=name, mode=fleet.mode, instances=instances, key_file=Path(fleet.key_file),
                         tokenizer_dir=Path(fleet.tokenizer_dir), eos_id=eos,
                         max_input_len=min(i.max_input_len for i in roles),
                         max_seq_len=min(i.max_seq_len for i in serving), **overrides)


@dataclass(frozen=True)
class FleetDirectives:
    """The controller's word to the gateway, from fleet.json: which instances drain, the canary split, the policy."""

    draining: frozenset[str] = frozenset()
    traffic: dict | None = None
    routing: dict | None = None


def fleet_directives(path: Path) -> FleetDirectives:
    fleet = _read(Path(path))
    return FleetDirectives(fleet.draining, fleet.routed_traffic, fleet.routing)
