"""Start, stop and inspect a fleet: one tritonserver per prefill, decode or colocated instance.

Decode instances start (and become ready) before prefill instances (seed 000 §4.5: a prefill handle is
useless until a decode instance can pull it). fleet.json is written after every start, so whatever a
crash mid-way leaves is named there and `trtpd down` can stop it; a failed start stops (by pid) every
instance this call started.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Protocol

from trtpd.engine.engine_config import EngineConfig, Role
from trtpd.errors import ConfigError, TrtpdError
from trtpd.fleet import records
from trtpd.fleet.gpus import GpuInventory, GpuShortage
from trtpd.fleet.instance import (ENTRY, InstancePlan, assign_cpus, instance_folder, pick_port, pick_ports,
                                  start_instance)
from trtpd.fleet.records import FleetRecord, InstanceRecord
from trtpd.repo.reference import KEY_FILE, ReferenceDeployment, check_pair
from trtpd.fleet import deployment
from trtpd.serving import stub_watch
from trtpd.fleet.tritonserver import ServerStartError, stop_server, until_ready, wait_ready

DOWN_TIMEOUT_S = deployment.DOWN_TIMEOUT_S


class Starter(Protocol):
    """How instances are started and stopped (local processes here; tests pass a fake)."""

    def start(self, fleet: FleetRecord, plan: InstancePlan) -> InstanceRecord: ...
    def wait_ready(self, inst: InstanceRecord, timeout_s: float) -> None: ...
    def stop(self, inst: InstanceRecord) -> None: ...


class LocalStarter:
    def __init__(self, spec: ReferenceDeployment) -> None:
        self.spec = spec

    def start(self, fleet: FleetRecord, plan: InstancePlan) -> InstanceRecord:
        return start_instance(self.spec, fleet, plan)

    def wait_ready(self, inst: InstanceRecord, timeout_s: float) -> None:
        try:
            wait_ready(inst.server, timeout_s)   # HTTP ready and the metrics endpoint answering
        except ServerStartError as exc:
            raise ServerStartError(f"instance {inst.name} ({inst.role}): {exc}", exc.returncode, exc.log_text) \
                from None
        except TrtpdError as exc:
            raise TrtpdError(f"instance {inst.name} ({inst.role}): {exc}") from None

    def stop(self, inst: InstanceRecord) -> None:
        stop_server(inst.server, DOWN_TIMEOUT_S)


def fleet_mode(prefill: int, decode: int, colocated: int) -> str:
    if colocated and (prefill or decode):
        raise ConfigError("a fleet is either disaggregated (prefill and decode instances) or colocated; "
                          f"got {prefill} prefill, {decode} decode and {colocated} colocated")
    if colocated > 0:
        return "colocated"
    if prefill < 1 or decode < 1:
        raise ConfigError(f"a disaggregated fleet needs at least 1 prefill and 1 decode instance "
                          f"(got {prefill} prefill, {decode} decode)")
    return "disaggregated"


def plan_waves(prefill: int, decode: int, colocated: int, cpus: list[int] | None = None,
               gpus: GpuInventory | None = None, gpus_per_role: dict[str, int] | None = None) \
        -> list[list[InstancePlan]]:
    """The start order in waves: decode instances, then prefill (or the colocated ones); ports, cores and (with an
    inventory) GPU sets chosen up front so no two instances get the same. A short inventory is refused before
    anything starts, naming what every role needs."""
    fleet_mode(prefill, decode, colocated)
    roles = [("decode", decode), ("prefill", prefill)] if not colocated else [("colocated", colocated)]
    if gpus is not None:
        _check_gpus(gpus, roles, gpus_per_role or {})
    cores = iter(assign_cpus(prefill + decode + colocated, cpus))
    used: set[int] = set()
    waves = []
    for role, count in roles:
        names = [f"{role}-{i}" for i in range(count)]
        waves.append([InstancePlan(name, role, next(cores), pick_ports(used),
                                   pick_port(used) if role == "prefill" else 0,
                                   gpus=gpus.assign(name, gpus_per_role[role]) if gpus is not None else ())
                      for name in names])
    return [w for w in waves if w]


def _check_gpus(gpus: GpuInventory, roles: list[tuple[str, int]], gpus_per_role: dict[str, int]) -> None:
    missing = [r for r, n in roles if n and r not in gpus_per_role]
    if missing:
        raise ConfigError(f"no GPU count per instance for {', '.join(missing)}")
    need = sum(n * gpus_per_role[r] for r, n in roles)
    if need > gpus.num_free:
        parts = " + ".join(f"{r} {n}x{gpus_per_role[r]}" for r, n in roles if n)
        raise GpuShortage(gpus.shortage(f"the fleet ({parts})", need))


def gpus_held_elsewhere(name: str) -> dict[str, list[int]]:
    """GPUs live instances of this host's other deployments hold ("<deployment>/<instance>" -> ids)."""
    held = {}
    root = records.trtpd_home() / "deployments"
    for path in sorted(root.glob(f"*/{records.FLEET_FILE}")) if root.is_dir() else []:
        if path.parent.name == name:
            continue
        try:
            fleet = records.load_record(path.parent.name)
        except TrtpdError:      # a broken record is `trtpd status`'s to report, not a reason to refuse here
            continue
        for inst in fleet.instances:
            if inst.gpus and inst.server.is_alive():
                held[f"{fleet.name}/{inst.name}"] = list(inst.gpus)
    return held


def fleet_up(name: str, spec: ReferenceDeployment, *, prefill: int = 0, decode: int = 0, colocated: int = 0,
             timeout_s: float = 240.0, replace: bool = False, starter: Starter | None = None,
             cpus: list[int] | None = None, triton_entry: bool = False, gpu_ids: tuple[int, ...] | None = None,
             gpus_per_role: dict[str, int] | None = None, tokenizer_dir: str | None = None) -> FleetRecord:
    """Starts the fleet `name` and returns once every instance is ready; with `triton_entry`, also a Triton
    server holding the ensemble, whose orchestrator routes across the instances (after they are ready).
    gpu_ids: the GPU inventory (each instance takes gpus_per_role[role] of them, none another live deployment
    here holds); then the workers are what the starter runs on them, not the reference engines, and
    tokenizer_dir is theirs."""
    mode = fleet_mode(prefill, decode, colocated)
    _check_name_free(name, replace)
    if gpu_ids is None:    # the reference engines run: they must exchange KV, and the tokenizer is theirs
        first = spec.engine(Role.COLOCATED if mode == "colocated" else Role.PREFILL)
        tokenizer_dir = tokenizer_dir or str(EngineConfig.load(first).checkpoint_path(first))
        problems = check_pair(spec.engine(Role.PREFILL), spec.engine(Role.DECODE)) if mode == "disaggregated" \
            else []
        if problems:
            raise ConfigError("prefill and decode engines are not compatible:\n  " + "\n  ".join(problems))
    elif not tokenizer_dir:
        raise ConfigError("a fleet on GPUs needs its workers' tokenizer folder (the gateway tokenizes with it)")
    inventory = None if gpu_ids is None else GpuInventory.from_holders(gpu_ids, gpus_held_elsewhere(name))
    waves = plan_waves(prefill, decode, colocated, cpus, inventory, gpus_per_role)
    folder = deployment.deployment_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    from trtpd.kv.handle import load_or_create_key_file
    key_file = folder / KEY_FILE
    load_or_create_key_file(key_file)
    fleet = FleetRecord(name, mode, str(spec.build_root), str(key_file), tokenizer_dir)
    fleet.save()
    starter = starter or LocalStarter(spec)
    try:
        for wave in waves:
            started = []
            for plan in wave:
                started.append((plan, starter.start(fleet, plan)))
                fleet.instances.append(started[-1][1])
                fleet.save()
            for plan, inst in started:
                ready_or_restarted(starter, fleet, plan, inst, timeout_s)
        if triton_entry:
            plan = InstancePlan(ENTRY, ENTRY, sorted(os.sched_getaffinity(0) if cpus is None else cpus),
                                pick_ports(used_ports(fleet)))
            fleet.instances.append(starter.start(fleet, plan))
            fleet.save()
            ready_or_restarted(starter, fleet, plan, fleet.instances[-1], timeout_s)
    except BaseException:
        for inst in reversed(fleet.instances):
            try:
                starter.stop(inst)
            except Exception:   # stop the others regardless
                pass
        fleet.path.unlink(missing_ok=True)
        raise
    return fleet


def used_ports(fleet: FleetRecord) -> set[int]:
    """Every port the fleet's instances were given (Triton's three, a prefill's KV port)."""
    used = {p for i in fleet.instances for p in (i.server.ports.http, i.server.ports.grpc, i.server.ports.metrics)}
    return used | {int(i.kv_bind.rsplit(":", 1)[1]) for i in fleet.instances if i.kv_bind}


def ready_or_restarted(starter: Starter, fleet: FleetRecord, plan: InstancePlan, inst: InstanceRecord,
                       timeout_s: float) -> InstanceRecord:
    """Waits until `inst` is ready; one that crashed while starting, or lost a port to another program before it
    could listen on it, is started again with new ports (until_ready), in the same place in fleet.json. Returns
    the instance that became ready."""
    def start_again(old: InstanceRecord) -> InstanceRecord:
        nonlocal plan
        used = used_ports(fleet)
        plan = dataclasses.replace(plan, ports=pick_ports(used), kv_port=pick_port(used) if plan.kv_port else 0)
        new = starter.start(fleet, plan)
        fleet.instances[fleet.instances.index(old)] = new
        fleet.save()
        return new
    return until_ready(inst, lambda i: starter.wait_ready(i, timeout_s), starter.stop, start_again, True,
                       lambda i: f"instance {i.name} ({i.role})")


def _check_name_free(name: str, replace: bool) -> None:
    if records.has_record(name):
        old = records.load_fleet(name)     # refuses a single-server deployment by name
        live = [i.name for i in old.instances if i.server.is_alive()]
        if live and not replace:
            raise TrtpdError(f"fleet {name!r} is already running ({', '.join(live)}); "
                             f"`trtpd down --name {name}` first, or choose another --name")
        fleet_down(name)


def fleet_down(name: str, timeout_s: float = DOWN_TIMEOUT_S) -> tuple[FleetRecord, list[str]]:
    """Stops every instance (SIGTERM to all at once, then wait; SIGKILL after `timeout_s`) and the gateway
    named in fleet.json, cleans what they left; returns the record and notes (pids no longer ours)."""
    fleet = records.load_fleet(name)
    notes: list[str] = []
    for inst in fleet.instances:
        folder = instance_folder(fleet, inst.name)
        if folder.is_dir():
            stub_watch.mark_stopping(folder)    # an orderly stop: the stubs' exits are not deaths
        if inst.server.pid_reused():
            notes.append(f"{inst.name}: pid {inst.server.pid} is no longer its tritonserver; nothing signalled")
        elif inst.server.is_alive():
            _signal(inst.server.pid, signal.SIGTERM)
    from trtpd.fleet.gateway_process import stop_gateway
    stop_gateway(fleet, timeout_s)   # with the controller, if supervisord runs one
    problems = []
    for inst in fleet.instances:
        stop_server(inst.server, timeout_s)
        try:
            deployment.clean_leftovers(inst.server)
        except TrtpdError as exc:
            problems.append(f"{inst.name}: {exc}")
    if problems:
        raise TrtpdError(f"fleet {name!r}: " + "; ".join(problems))
    fleet.path.unlink(missing_ok=True)
    return fleet, notes


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def fleet_status(name: str) -> dict:
    from trtpd.fleet.state import fleet_view
    return fleet_view(records.load_fleet(name))
