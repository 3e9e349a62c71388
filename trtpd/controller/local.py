"""The local executor: the controller's instances as this machine's tritonserver processes (the fleet's own
start-up, fleet.json, stub watch), the gateway told of every change through fleet.json + POST /admin/reload.

With `backend: trtllm-serve` an instance is a trtllm-serve worker instead (trtpd/fleet/serve_workers.py): its CPU
twin, or with a spec's `gpus` the real worker on a GPU set of its own. The GPU sets live in fleet.json (each
instance's `gpus`): before every start the inventory is rebuilt from them, from the instances still being stopped
here, and from other deployments' live instances, so a stopped instance's GPUs are free again once its process
has gone.

Health: an instance is alive while its tritonserver runs and no stub of it died (stub_watch's death record);
ready when the server answers ready and the gateway can route to it. Holds: the gateway's exact count of
what it has in flight there, plus the instance's own waiting/active requests (for prefill: the KV exports it
still holds, which outlive the gateway's view when a client leaves before decode pulled).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

from trtpd.controller.types import WORLD, ObservedInstance, RoleShape, TrafficSplit
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.errors import TrtpdError
from trtpd.fleet.gpus import GpuInventory, GpuShortage
from trtpd.fleet.instance import InstancePlan, instance_folder, pick_port, pick_ports, start_instance, start_world
from trtpd.fleet.records import FleetRecord, load_fleet
from trtpd.fleet.state import instance_state
from trtpd.schema.request_sample import RequestSample
from trtpd.fleet import deployment
from trtpd.serving import stub_watch
from trtpd.fleet.tritonserver import stop_server

STOP_TIMEOUT_S = deployment.DOWN_TIMEOUT_S
FORCE_STOP_TIMEOUT_S = 0.5
# how long a start waits for stops in progress to free the GPUs it needs: as long as a stop can take (the server's
# stop, then its stubs' SIGKILL and exit); at 5 s a heal on a full inventory failed once in CI (start_failed,
# GpuShortage naming the dead instance's GPU) and succeeded on the next pass
RELEASE_WAIT_S = STOP_TIMEOUT_S + stub_watch.KILL_WAIT_S + 1.0


class LocalExecutor:
    def __init__(self, name: str, mode: str, cpus: list[int] | None = None) -> None:
        self.name = name
        self.mode = mode
        self.cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
        self._stopping: list[threading.Thread] = []   # servers being stopped (the loop does not wait for them)
        self._releasing: dict[str, tuple[int, ...]] = {}   # GPUs the servers being stopped still hold

    # ---- the fleet record -------------------------------------------------------------------
    def fleet(self) -> FleetRecord:
        return load_fleet(self.name)

    def _save(self, fleet: FleetRecord) -> None:
        fleet.save()
        self._reload_gateway(fleet)

    def _gateway_url(self, fleet: FleetRecord) -> str | None:
        gw = fleet.gateway
        return f"http://{gw['host']}:{gw['port']}" if gw and gw.get("port") else None

    def _admin(self, fleet: FleetRecord, method: str, path: str, timeout_s: float = 5.0) -> dict | None:
        url = self._gateway_url(fleet)
        if url is None:
            return None
        from trtpd.kv.auth import gateway_admin_token
        from trtpd.kv.handle import load_or_create_key_file
        token = gateway_admin_token(load_or_create_key_file(Path(fleet.key_file)))
        req = urllib.request.Request(url + path, method=method, data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 503:   # /admin/reload answers the health body, 503 while no role is ready
                return json.loads(exc.read())
            raise TrtpdError(f"gateway {url}{path}: HTTP {exc.code}: {exc.read()[:300]!r}") from None
        except OSError:
            return None

    def _reload_gateway(self, fleet: FleetRecord) -> None:
        self._admin(fleet, "POST", "/admin/reload")

    def gateway_health(self, fleet: FleetRecord | None = None) -> dict | None:
        fleet = fleet or self.fleet()
        url = self._gateway_url(fleet)
        if url is None:
            return None
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())
        except OSError:
            return None

    def samples(self, since_s: float) -> list[RequestSample]:
        """Finished requests since `since_s` (unix time) from the gateway, for the rollout gate and the autoscaler."""
        body = self._admin(self.fleet(), "GET", f"/admin/requests?since={since_s}")
        return [RequestSample.from_dict(s) for s in body["requests"]] if body else []

    # ---- Executor ---------------------------------------------------------------------------
    def observe(self) -> list[ObservedInstance]:
        fleet = self.fleet()
        health = self.gateway_health(fleet)
        views = {v["name"]: v for v in health["instances"]} if health else {}
        out = []
        for inst in fleet.instances:
            if inst.role not in ("prefill", "decode", "colocated", WORLD):
                continue
            state, reason = instance_state(fleet, inst)
            seen = [views.get(e.name) for e in inst.endpoints()]     # a world: each of its role models
            routable = all(v is not None and v["state"] in ("ready", "draining") for v in seen)
            alive = state in ("ready", "starting")
            ready = state == "ready" and (routable if health is not None else True)
            # the gateway counts its own requests exactly, the instance (lagging) also those the gateway no longer
            # tracks (an export a client abandoned): at least the larger of the two is still there
            holds = -1 if None in seen else sum(max(v.get("gateway_holds", 0), v["waiting"] + v["active"])
                                                for v in seen)
            unready = next((v for v in seen if v is not None and v["state"] not in ("ready", "draining")), None)
            out.append(ObservedInstance(inst.name, inst.role, inst.revision, alive, ready, holds, reason or (
                f"gateway sees it {unready['state']}" if unready and not ready else "")))
        return out

    def start(self, name: str, role: str, revision: int, shape: RoleShape) -> dict:
        fleet = self.fleet()
        spec = reference_deployment(shape, self.mode)
        used = {p for i in fleet.instances for p in (i.server.ports.http, i.server.ports.grpc, i.server.ports.metrics)}
        used |= {int(i.kv_bind.rsplit(":", 1)[1]) for i in fleet.instances if i.kv_bind}
        plan = InstancePlan(name, role, self._pick_cpus(fleet, shape.cpus_per_instance), pick_ports(used),
                            pick_port(used) if role == "prefill" else 0, revision, shape.step_delay_ms)
        if role == WORLD and shape.gpu_ids:      # a Triton MPI world on its own GPU set (trtllm/world.py)
            from trtpd.fleet.gpu_world import start_gpu_world
            plan = replace(plan, gpus=self._pick_gpus(fleet, name, shape))
            inst = start_gpu_world(fleet, plan, Path(shape.serve_dir), {m.role: n for m, n in shape.world_roles})
        elif role == WORLD:                      # its CPU stand-in: one tritonserver for the revision's every instance
            inst = start_world(world_deployment(shape), fleet, plan)
        elif shape.backend == "trtllm-serve":      # one executor for both: only the command differs
            from trtpd.fleet.serve_workers import ServeStarter
            workers = None
            if shape.gpu_ids:                    # real workers, each on a GPU set of its own
                from trtpd.fleet.gpu_workers import load_gpu_workers
                workers = load_gpu_workers(shape.serve_dir, shape.serve_command)
                plan = replace(plan, gpus=self._pick_gpus(fleet, name, shape))
            inst = ServeStarter(spec, transceiver=shape.kv_transport, gpus=workers).start(fleet, plan)
        else:
            inst = start_instance(spec, fleet, plan)
        fleet = self.fleet()   # re-read: nothing else writes it while the controller runs, but stay safe
        fleet.instances = [i for i in fleet.instances if i.name != name] + [inst]
        self._save(fleet)
        return {"pid": inst.server.pid, "start_time": inst.server.start_time, "cpus": inst.cpus,
                "grpc": inst.grpc_url, "http": inst.http_url, "metrics": inst.metrics_url, "kv": inst.kv_advertise,
                "log": str(inst.server.log_path), **({"gpus": list(inst.gpus)} if inst.gpus else {})}

    def gpu_inventory(self, fleet: FleetRecord, device_ids: tuple[int, ...]) -> GpuInventory:
        """The inventory as it stands: what this deployment's live instances hold (fleet.json; a process that died,
        say SIGKILLed, holds nothing even before the controller has stopped it), what the ones being stopped
        still hold, and what other deployments' live instances here hold."""
        from trtpd.fleet.launcher import gpus_held_elsewhere
        holders = {**gpus_held_elsewhere(self.name), **dict(self._releasing)}
        holders.update({i.name: list(i.gpus) for i in fleet.instances if i.gpus and i.server.is_alive()})
        return GpuInventory.from_holders(device_ids, holders)

    def _pick_gpus(self, fleet: FleetRecord, name: str, shape: RoleShape) -> tuple[int, ...]:
        """A GPU set for instance `name` (GpuShortage, naming what is needed and free, when none is left). A
        replacement started in the pass that stopped its predecessor (healing on a full inventory) waits, at most
        RELEASE_WAIT_S, for the stops still running to free their GPUs, instead of failing once."""
        try:
            return self.gpu_inventory(fleet, shape.gpu_ids).assign(name, shape.gpus_per_instance)
        except GpuShortage:
            if not self._releasing:
                raise
        deadline = time.monotonic() + RELEASE_WAIT_S
        for thread in self._stopping:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.gpu_inventory(self.fleet(), shape.gpu_ids).assign(name, shape.gpus_per_instance)

    def _pick_cpus(self, fleet: FleetRecord, count: int) -> list[int]:
        """The `count` cores the fewest running instances are pinned to (ties: lowest core)."""
        load = Counter({c: 0 for c in self.cpus})
        for inst in fleet.instances:
            for c in inst.cpus:
                if c in load:
                    load[c] += 1
        return sorted(sorted(self.cpus, key=lambda c: (load[c], c))[:max(1, min(count, len(self.cpus)))])

    def drain(self, name: str) -> None:
        fleet = self.fleet()
        fleet.instance(name).admin_state = "draining"
        self._save(fleet)

    def stop(self, name: str, force: bool = False, reason: str = "") -> None:
        """Takes it out of fleet.json (the gateway forgets it at once), then stops its server and cleans what it
        left on a thread of its own: a graceful tritonserver exit takes seconds, and the controller's next pass
        (a death elsewhere, a drain) should not wait for it."""
        fleet = self.fleet()
        inst = next((i for i in fleet.instances if i.name == name), None)
        if inst is None:
            return
        fleet.instances = [i for i in fleet.instances if i.name != name]
        self._save(fleet)
        folder = instance_folder(fleet, name)
        if folder.is_dir():
            stub_watch.mark_stopping(folder, f"instance {name} is being stopped by the controller"
                                             f"{': ' + reason if reason else ''}; retry (other instances serve)")

        if inst.gpus:      # still held until the process is gone
            self._releasing[name] = tuple(inst.gpus)

        def finish() -> None:
            try:
                stop_server(inst.server, FORCE_STOP_TIMEOUT_S if force else STOP_TIMEOUT_S)
                try:
                    deployment.clean_leftovers(inst.server)
                except TrtpdError:
                    pass
            finally:
                self._releasing.pop(name, None)

        self._stopping = [t for t in self._stopping if t.is_alive()]
        thread = threading.Thread(target=finish, name=f"stop-{name}", daemon=False)
        thread.start()
        self._stopping.append(thread)

    def wait_stopped(self, timeout_s: float = STOP_TIMEOUT_S + 2) -> None:
        """Waits for the servers being stopped (the controller calls it before it exits)."""
        for thread in self._stopping:
            thread.join(timeout_s)

    def set_traffic(self, split: TrafficSplit) -> None:
        fleet = self.fleet()
        fleet.traffic = asdict(split) if split.canary_revision else None
        self._save(fleet)

    def apply_in_place(self, settings: dict) -> None:
        fleet = self.fleet()
        if "routing" in settings:
            fleet.routing = settings["routing"]
        self._save(fleet)

    def relabel(self, names: list[str], revision: int) -> None:
        """Instances an unchanged role keeps through a promotion now belong to the new revision."""
        fleet = self.fleet()
        for inst in fleet.instances:
            if inst.name in names:
                inst.revision = revision
        self._save(fleet)


def reference_deployment(shape: RoleShape, mode: str) -> ReferenceDeployment:
    """The reference backend's settings for one role's instances of one revision."""
    engine = Path(shape.engine_dir)
    overrides = {"prefill_engine": engine} if shape.role == "prefill" else \
        {"decode_engine": engine} if shape.role == "decode" else {}
    kv_transport = "tcp" if shape.backend == "trtllm-serve" else shape.kv_transport   # its twin's transport
    return ReferenceDeployment(build_root=engine.parent, mode=mode, kv_transport=kv_transport,
                               kv_transfer_timeout_ms=shape.kv_transfer_timeout_ms,
                               max_batch_size=shape.max_batch_size, **overrides)


def world_deployment(shape: RoleShape) -> ReferenceDeployment:
    """The single-server reference deployment standing in for a world on CPU: the world's roles' engines and counts.
    Its KV moves over the twin's shm transport inside the one server, where TensorRT-LLM's world uses MPI."""
    members = {member.role: (member, count) for member, count in shape.world_roles}
    (prefill, n_prefill), (decode, n_decode) = members["prefill"], members["decode"]
    engine = Path(prefill.engine_dir)
    return ReferenceDeployment(build_root=engine.parent, mode="disaggregated", kv_transport="shm",
                               prefill_instances=n_prefill, decode_instances=n_decode,
                               kv_transfer_timeout_ms=shape.kv_transfer_timeout_ms,
                               max_batch_size=max(prefill.max_batch_size, decode.max_batch_size),
                               prefill_engine=engine, decode_engine=Path(decode.engine_dir))


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TrtpdError(f"timed out after {timeout_s:.0f} s waiting for {what}")
