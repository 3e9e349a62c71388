"""Bringing a deployment up under the controller, the controller's own process, and stopping it.

`bring_up(spec_path)`: lints the spec, records it as a new revision, starts every instance (decode and
prefill at once; the gateway routes only to ready ones) and waits until all are ready, starts the gateway,
then the controller process (`python -m trtpd.controller run --name NAME`), which from then on heals,
scales and rolls out. A spec with a `kubernetes:` section goes to trtpd/controller/k8s/cluster.py instead (pods,
the gateway in the cluster; the same store, the same controller process). `stop_controller(name)`: SIGTERM to
that process (by pid and start time).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path

from trtpd.controller.controller import Controller
from trtpd.controller.spec import DeploymentSpec, check_revision, load_spec
from trtpd.controller.store import ControllerStore, actor
from trtpd.errors import ConfigError, TrtpdError
from trtpd.fleet import deployment
from trtpd.process_identity import is_running, start_time, stop_process

TICK_S = 0.5


def controller_alive(store: ControllerStore) -> dict | None:
    record = store.get("controller")
    if record and is_running(int(record["pid"]), record.get("start_time")):
        return record
    return None


def is_kubernetes(name: str) -> bool:
    """Whether deployment `name`'s stable revision runs on Kubernetes (its spec has a kubernetes section)."""
    path = deployment.deployment_dir(name) / "controller.db"
    if not path.is_file():
        return False
    store = ControllerStore(path)
    stable = store.get("stable_revision")
    return bool(stable) and store.revision(int(stable)).spec_json.get("kubernetes") is not None


def kubernetes_deployments() -> list[str]:
    root = deployment.trtpd_home() / "deployments"
    return [p.parent.name for p in sorted(root.glob("*/controller.db")) if is_kubernetes(p.parent.name)]


def new_controller(store: ControllerStore, name: str, mode: str) -> Controller:
    """The executor the stable revision names: Kubernetes (its `kubernetes:` section) or local processes."""
    stable = store.get("stable_revision")
    spec = DeploymentSpec.from_json(store.revision(int(stable)).spec_json) if stable else None
    if spec is not None and spec.kubernetes is not None:
        from trtpd.controller.k8s.cluster import kubernetes_controller
        return kubernetes_controller(store, spec)
    from trtpd.controller.local import LocalExecutor
    executor = LocalExecutor(name, mode)
    return Controller(store, executor, samples=executor.samples, health=executor.gateway_health)


def record_revision(store: ControllerStore, spec: DeploymentSpec, spec_path: Path) -> int:
    """`trtpd up`: the spec becomes the promoted revision; an earlier run's instance rows are closed."""
    from dataclasses import replace
    revision = store.add_revision(spec.to_yaml(), spec.spec_json(), str(spec_path), actor(), "trtpd up")
    store.set_revision_status(revision, "promoted")
    for row in store.instances(states=("starting", "ready", "draining", "failed")):   # an earlier run's rows
        store.put_instance(replace(row, state="stopped", reason="deployment restarted"))
    store.put_many({"stable_revision": revision, "counts": spec.unit_counts(), "rollout": None, "traffic": None})
    store.audit(actor(), "up", revision, {"source": str(spec_path), "counts": spec.counts()})
    return revision


def tick_until_ready(controller: Controller, store: ControllerStore, revision: int, timeout_s: float) -> None:
    """Runs the controller in this process until every wanted instance is ready; raises on the first instance
    that fails to start, or at timeout_s."""
    started = time.monotonic()
    while not controller.converged():
        controller.tick()
        failed = [r for r in store.instances(states=("failed", "stopped")) if r.reason.startswith(
            ("died", "not ready", "start failed")) and r.since_s >= store.revision(revision).created_at]
        if failed:
            raise TrtpdError(f"instance {failed[0].name} failed to start: {failed[0].reason}")
        if time.monotonic() - started > timeout_s:
            raise TrtpdError(f"the deployment was not ready within {timeout_s:.0f} s")
        time.sleep(0.2)


def bring_up(spec_path: Path, *, timeout_s: float = 300.0, daemon: bool = True, progress=print) -> dict:
    """Returns {"name", "revision", "gateway", "instances"} once the fleet is ready and its controller runs."""
    from trtpd.fleet.gateway_process import attach_gateway
    from trtpd.fleet.records import FleetRecord, has_record, load_fleet
    from trtpd.kv.handle import load_or_create_key_file
    from trtpd.repo.reference import KEY_FILE

    spec = load_spec(spec_path)
    problems = check_revision(spec, None, revision=1)
    if problems:
        raise ConfigError(f"{spec_path}: refused:\n  " + "\n  ".join(problems))
    if spec.kubernetes is not None:
        from trtpd.controller.k8s.cluster import bring_up_kubernetes
        return bring_up_kubernetes(spec, spec_path, timeout_s=timeout_s, daemon=daemon, progress=progress)
    name = spec.name
    # load_fleet refuses a single-server deployment by name
    if has_record(name) and any(i.server.is_alive() for i in load_fleet(name).instances):
        raise TrtpdError(f"deployment {name!r} is already running; change it with `trtpd rollout {spec_path}` "
                         f"or `trtpd scale {name} ...`, or stop it with `trtpd down --name {name}`")
    folder = deployment.deployment_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    store = ControllerStore.for_deployment(name)
    if controller_alive(store):
        raise TrtpdError(f"deployment {name!r} has a controller running (pid {store.get('controller')['pid']}); "
                         f"`trtpd down --name {name}` first")
    key_file = folder / KEY_FILE
    load_or_create_key_file(key_file)
    revision = record_revision(store, spec, spec_path)
    shapes = spec.role_shapes()
    first = shapes[spec.role_names[0]].engine_dir
    fleet = FleetRecord(name, spec.mode, str(Path(first).parent), str(key_file), tokenizer_dir(spec, Path(first)))
    fleet.routing = asdict(spec.routing_policy())
    fleet.save()
    controller = new_controller(store, name, spec.mode)
    started = time.monotonic()
    try:
        tick_until_ready(controller, store, revision, timeout_s)
        progress(f"{name}: {len(store.instances(states=('ready',)))} instances ready in "
                 f"{time.monotonic() - started:.1f} s")
        fleet = load_fleet(name)
        g = spec.gateway
        # the gateway and the controller run under supervisord, which restarts either one that dies
        attach_gateway(fleet, port=g.port, host=g.host, api_key_file=g.api_key_file, no_auth=not g.auth,
                       controller=daemon, extra_args=[
                           "--max-inflight", str(g.max_inflight), "--max-queued", str(g.max_queued),
                           "--slo-ttft-s", str(spec.slo.ttft_s), "--slo-tpot-s", str(spec.slo.tpot_s)])
        if daemon:
            wait_controller(name)
    except BaseException:
        from trtpd.fleet.launcher import fleet_down
        try:
            fleet_down(name)
        except TrtpdError:
            pass
        raise
    fleet = load_fleet(name)
    return {"name": name, "revision": revision, "gateway": fleet.gateway, "roles": list(spec.role_names),
            "instances": [i.name for i in fleet.instances]}


def tokenizer_dir(spec, first_engine: Path) -> str:
    """The folder the gateway tokenizes with: the reference engines' checkpoint, or on GPUs the workers' --tokenizer."""
    if spec.gpus is None:
        from trtpd.engine.engine_config import EngineConfig
        return str(EngineConfig.load(first_engine).checkpoint_path(first_engine))
    from trtpd.fleet.gpu_workers import load_gpu_workers
    return load_gpu_workers(spec.serve_dir(), spec.role_shapes()[spec.role_names[0]].serve_command) \
        .role(spec.role_names[0]).tokenizer_dir


def wait_controller(name: str, timeout_s: float = 30.0) -> dict:
    """The controller's record once its first pass ran (it writes it itself)."""
    store = ControllerStore.for_deployment(name)
    log_path = deployment.deployment_dir(name) / "controller.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = controller_alive(store)
        if record is not None:
            return record
        time.sleep(0.1)
    raise TrtpdError(f"the controller did not start within {timeout_s:.0f} s; see {log_path}")


def run_controller(name: str, interval_s: float = TICK_S) -> None:
    """The controller process's body: record itself, tick until SIGTERM."""
    from trtpd import log_limits
    log_limits.configure(logging.INFO)
    store = ControllerStore.for_deployment(name)
    other = controller_alive(store)
    if other and int(other["pid"]) != os.getpid():
        raise TrtpdError(f"deployment {name!r} already has a controller (pid {other['pid']})")
    spec = DeploymentSpec.from_json(store.revision(int(store.get("stable_revision"))).spec_json)
    controller = new_controller(store, name, spec.mode)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    controller.tick()
    store.put("controller", {"pid": os.getpid(), "start_time": start_time(os.getpid()), "started_at": time.time()})
    store.audit(actor(), "controller_started", controller.stable_revision, {"pid": os.getpid()})
    controller.run(interval_s, should_stop=lambda: bool(stopping))
    controller.executor.wait_stopped()
    store.audit(actor(), "controller_stopped", controller.stable_revision, {"pid": os.getpid()})


def stop_controller(name: str, timeout_s: float = 10.0) -> int | None:
    """SIGTERM to the deployment's controller (if it runs); returns its pid."""
    path = deployment.deployment_dir(name) / "controller.db"
    if not path.is_file():
        return None
    store = ControllerStore.for_deployment(name)
    record = controller_alive(store)
    if record is None:
        return None
    stop_process(int(record["pid"]), record.get("start_time"), timeout_s)
    return int(record["pid"])


def mark_all_stopped(name: str, reason: str) -> None:
    from dataclasses import replace
    path = deployment.deployment_dir(name) / "controller.db"
    if not path.is_file():
        return
    store = ControllerStore.for_deployment(name)
    for row in store.instances(states=("starting", "ready", "draining", "failed")):
        store.put_instance(replace(row, state="stopped", since_s=time.time(), reason=reason))
    store.audit(actor(), "down", int(store.get("stable_revision", 0)), {"reason": reason})
