"""One instance: a one-model repository (the `reference` role template, as repository_plan renders it for
the single server) and its own tritonserver on its own ports, state folder and cores. A world (backend
tensorrt-llm on CPU) is the whole single-server repository in one tritonserver instead (start_world).

Every instance of a fleet signs and verifies with the fleet's one KV key, so a prefill instance's handles
and the orchestrator's tokens verify on any decode instance.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from trtpd.engine.engine_config import EngineConfig, Role
from trtpd.errors import ConfigError
from trtpd.fleet.records import FleetRecord, InstanceRecord
from trtpd.repo.reference import ReferenceDeployment, repository_plan
from trtpd.repo.render import ModelPlan, render_repository
from trtpd.schema.fleet_file import WORLD, world_endpoint
from trtpd.serving import stub_watch
from trtpd.fleet.tritonserver import ServerPorts, free_port, start_server

HOST = "127.0.0.1"


@dataclass(frozen=True)
class InstancePlan:
    name: str            # "<role>-<index>"
    role: str
    cpus: list[int]
    ports: ServerPorts
    kv_port: int = 0     # prefill: the KV exporter's port (fixed, so fleet.json can name it); else 0
    revision: int = 0    # the controller's revision this instance runs (0: not under a controller)
    step_delay_ms: int = 0   # fault injection: a pause after every engine step (rollout-gate tests)
    gpus: tuple[int, ...] = ()   # its GPU set from the inventory (fleet/gpus.py); (): no GPU, the CPU twin


def assign_cpus(count: int, available: list[int] | None = None) -> list[list[int]]:
    """Round-robin over the cores this process may use: with at least as many cores as instances each
    instance gets its own (core j goes to instance j % count); with fewer, instances share cores."""
    cores = sorted(os.sched_getaffinity(0) if available is None else available)
    if not cores:
        raise ConfigError("no CPU cores available (os.sched_getaffinity is empty)")
    if count <= len(cores):
        return [[c for j, c in enumerate(cores) if j % count == i] for i in range(count)]
    return [[cores[i % len(cores)]] for i in range(count)]


def shares_cores(instances: list[list[int]]) -> bool:
    seen: set[int] = set()
    for cpus in instances:
        if seen & set(cpus):
            return True
        seen |= set(cpus)
    return False


def pick_port(used: set[int]) -> int:
    """A free port on 127.0.0.1 not yet given to another instance of this fleet (marked used)."""
    for _ in range(100):
        port = free_port(HOST)
        if port not in used:
            used.add(port)
            return port
    raise ConfigError("could not find a free port on 127.0.0.1 after 100 tries")


def pick_ports(used: set[int]) -> ServerPorts:
    return ServerPorts(pick_port(used), pick_port(used), pick_port(used))


def render_instance(spec: ReferenceDeployment, plan: InstancePlan, key_file: Path, out_dir: Path) -> Path:
    """The instance's repository: its one role model, named after the role, with instance_name and the KV
    exporter address as model parameters."""
    mode = "colocated" if plan.role == Role.COLOCATED.value else "disaggregated"
    plans = {p.name: p for p in repository_plan(dataclasses.replace(spec, mode=mode), Path(key_file))}
    if plan.role not in plans:
        raise ConfigError(f"instance {plan.name}: role {plan.role!r} is not one of prefill, decode, colocated")
    values = {**plans[plan.role].values, "instance_count": 1, "instance_name": plan.name,
              "kv_host": HOST, "kv_port": plan.kv_port, "kv_advertise_host": HOST,
              "step_delay_ms": plan.step_delay_ms}
    return render_repository([ModelPlan(plan.role, "reference", values)], out_dir, overwrite=True)


ENTRY = "entry"
ENTRY_MODELS = ("preprocessing", "postprocessing", "disagg_bls", "ensemble")


def render_entry(spec: ReferenceDeployment, fleet: FleetRecord, out_dir: Path) -> Path:
    """The fleet's Triton entry: the single server's ensemble, pre/post-processing and orchestrator, whose
    orchestrator reaches the fleet's role instances over gRPC (fleet_file) instead of local role models."""
    plans = repository_plan(dataclasses.replace(spec, mode=fleet.mode), Path(fleet.key_file))
    entry = [ModelPlan(p.name, p.template, {**p.values, "fleet_file": str(fleet.path)} if p.name == "disagg_bls"
                       else p.values) for p in plans if p.name in ENTRY_MODELS]
    return render_repository(entry, out_dir, overwrite=True)


WORLD_ROLES = (Role.PREFILL.value, Role.DECODE.value)


def render_world(spec: ReferenceDeployment, plan: InstancePlan, key_file: Path, out_dir: Path) -> Path:
    """A world's repository on CPU: the single-server reference deployment (ensemble, pre/post-processing, the
    orchestrator, and spec.prefill_instances / decode_instances instances of the prefill and decode models in one
    tritonserver), signed with the fleet's key, each role model's series labelled with its endpoint's name."""
    plans = repository_plan(dataclasses.replace(spec, mode="disaggregated"), Path(key_file))
    models = [ModelPlan(p.name, p.template, {**p.values, "instance_name": world_endpoint(plan.name, p.name),
                                             "step_delay_ms": plan.step_delay_ms})
              if p.name in WORLD_ROLES else p for p in plans]
    return render_repository(models, out_dir, overwrite=True)


def start_world(spec: ReferenceDeployment, fleet: FleetRecord, plan: InstancePlan) -> InstanceRecord:
    """Renders and starts the tritonserver of a world standing in, on CPU, for a Triton MPI world (returns without
    waiting for readiness). Its KV moves between its own prefill and decode models only (the gateway keeps a
    request's two phases in one world)."""
    configs = {role: EngineConfig.load(spec.engine(Role(role))) for role in WORLD_ROLES}
    folder = instance_folder(fleet, plan.name)
    folder.mkdir(parents=True, exist_ok=True)
    stub_watch.clear_state(folder)
    repo = render_world(spec, plan, Path(fleet.key_file), folder / "repo")
    server = start_server(repo, folder, host=HOST, ports=plan.ports, cpus=plan.cpus)
    decode = configs[Role.DECODE.value]
    return InstanceRecord(plan.name, WORLD, "ensemble", server, str(spec.build_root), spec.kv_transport, "", "",
                          list(plan.cpus), decode.max_batch_size, decode.num_kv_blocks,
                          min(c.max_input_len for c in configs.values()), decode.max_seq_len,
                          revision=plan.revision, world_roles=list(WORLD_ROLES))


def instance_folder(fleet: FleetRecord, name: str) -> Path:
    return fleet.folder / "instances" / name


def start_instance(spec: ReferenceDeployment, fleet: FleetRecord, plan: InstancePlan) -> InstanceRecord:
    """Renders and starts the instance's tritonserver (returns without waiting for readiness)."""
    engine = spec.engine(Role.COLOCATED if fleet.mode == "colocated" else Role.DECODE) if plan.role == ENTRY \
        else spec.engine(Role(plan.role))
    config = EngineConfig.load(engine)
    folder = instance_folder(fleet, plan.name)
    folder.mkdir(parents=True, exist_ok=True)
    stub_watch.clear_state(folder)
    repo = render_entry(spec, fleet, folder / "repo") if plan.role == ENTRY else \
        render_instance(spec, plan, Path(fleet.key_file), folder / "repo")
    server = start_server(repo, folder, host=HOST, ports=plan.ports, cpus=plan.cpus)
    kv = f"{HOST}:{plan.kv_port}" if plan.role == Role.PREFILL.value else ""
    return InstanceRecord(plan.name, plan.role, "ensemble" if plan.role == ENTRY else plan.role, server,
                          str(engine), spec.kv_transport, kv, kv,
                          list(plan.cpus), config.max_batch_size, config.num_kv_blocks, config.max_input_len,
                          config.max_seq_len, revision=plan.revision)
