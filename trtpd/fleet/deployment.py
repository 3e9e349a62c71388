"""Single-server deployments: render a repository, run one tritonserver for it, remember it, stop it.

State lives under $TRTPD_HOME (default ./.trtpd): deployments/<name>/ holds the rendered
repository, its KV key, the server log, fleet.json (records.py, the record every bring-up writes: here one
instance of role "server", with its pid and start time, ports, mode) and the stubs' registry and death record
(stub_watch.py). A pid is signalled only while its start time is the one recorded at `up`; `up` first removes
what a crashed deployment of the same name left behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from trtpd.deploy.spec import ReferenceDeployment, key_file_for
from trtpd.errors import TrtpdError
from trtpd.fleet import records
from trtpd.fleet.records import SERVER, FleetRecord, InstanceRecord, deployment_dir, trtpd_home
from trtpd.fleet.tritonserver import (ServerPorts, ServerProcess, port_is_free, start_server, start_until_ready,
                                      stop_server)
from trtpd.repo.reference import render_reference_repository
from trtpd.serving import stub_watch

__all__ = ["DOWN_TIMEOUT_S", "Deployment", "clean_leftovers", "deployment_dir", "down", "list_deployments",
           "server_state", "trtpd_home", "up"]

# tritonserver's own exit timeout is 3 s (tritonserver.EXIT_TIMEOUT_S) for in-flight requests; a server still
# finalizing its python stubs 1 s after that is killed (its group too), so `down` ends in seconds under load
DOWN_TIMEOUT_S = 6.0


def server_state(server: ServerProcess, death: dict | None, whose: str) -> tuple[str, str]:
    """(ready | starting | failed | exited, reason) of one tritonserver; `death` is the record a stub of it
    wrote (stub_watch), `whose` names the server in the reason ("this deployment's", "its")."""
    if death is not None:
        return "failed", stub_watch.format_death(death)
    if server.is_ready():
        return "ready", ""
    if server.is_alive():
        return "starting", ""
    if server.pid_reused():
        return "exited", f"pid {server.pid} is no longer {whose} tritonserver"
    return "exited", f"tritonserver (pid {server.pid}) is not running; see {server.log_path}"


@dataclass
class Deployment:
    """A single-server deployment, as its record (fleet.json, one instance of role "server") holds it."""

    name: str
    mode: str
    server: ServerProcess
    started_at: float
    build_root: str
    kv_transport: str = ""
    note: str = ""      # what `down` has to say (e.g. the pid was not ours any more)

    @property
    def folder(self) -> Path:
        return deployment_dir(self.name)

    def death(self) -> dict | None:
        """The record a stub wrote when a peer stub died (None: no death seen)."""
        record = stub_watch.read_death(self.folder)
        return record if record and record.get("server_pid") == self.server.pid else None

    def state(self) -> tuple[str, str]:
        """(ready | starting | failed | exited, reason)."""
        return server_state(self.server, self.death(), "this deployment's")

    def record(self) -> FleetRecord:
        """The deployment as the one record: its server is its only instance, routed by nobody (its ensemble is
        its own entry), so the engine sizes a gateway would route by are left 0."""
        server = InstanceRecord(SERVER, SERVER, "ensemble", self.server, self.build_root, self.kv_transport, "", "",
                                [], 0, 0, 0, 0)
        return FleetRecord(self.name, self.mode, self.build_root, str(key_file_for(Path(self.server.repo))),
                           str(Path(self.build_root) / "checkpoint"), [server], started_at=self.started_at)

    def save(self) -> None:
        self.record().save()    # atomically, 0600, in the owner's 0700 folder

    @classmethod
    def load(cls, name: str) -> "Deployment":
        return cls.of(records.load_record(name))

    @classmethod
    def of(cls, record: FleetRecord) -> "Deployment":
        server = record.single_server
        if server is None:
            raise TrtpdError(f"{record.name!r} is a fleet, not a single-server deployment (see `trtpd status "
                             f"--name {record.name}`)")
        return cls(record.name, record.mode, server.server, record.started_at, record.build_root,
                   server.kv_transport)


def up(name: str, spec: ReferenceDeployment, *, ports: ServerPorts | None = None, timeout_s: float = 180.0,
       replace: bool = False) -> Deployment:
    folder = deployment_dir(name)
    if records.is_single_server(name):
        existing = Deployment.load(name)
        if existing.server.is_alive():
            if not replace:
                raise TrtpdError(f"deployment {name!r} is already running (pid {existing.server.pid}); "
                                 f"`trtpd down --name {name}` first, or choose another --name")
            stop_server(existing.server, DOWN_TIMEOUT_S)
        clean_leftovers(existing.server)
    folder.mkdir(parents=True, exist_ok=True)
    stub_watch.clear_state(folder)
    repo = render_reference_repository(spec, folder / "repo", overwrite=True)
    deployments: list[Deployment] = []

    def start(chosen: ServerPorts | None) -> ServerProcess:
        if deployments:               # a start again: nothing of the one that failed may mislead its stubs
            stub_watch.clear_state(folder)
        server = start_server(repo, folder, ports=chosen, log_path=folder / "tritonserver.log")
        deployments.append(Deployment(name, spec.mode, server, time.time(), str(spec.build_root), spec.kv_transport))
        deployments[-1].save()        # named on disk at once: `trtpd down` finds it whatever happens next
        return server

    try:
        start_until_ready(start, ports, timeout_s)
    except BaseException:
        (folder / records.FLEET_FILE).unlink(missing_ok=True)
        raise
    return deployments[-1]


def clean_leftovers(server: ServerProcess) -> None:
    """What a server that is gone left: its stubs (by pid, those of its repository that started after it),
    its /dev/shm files (unless a live server now uses its HTTP port, hence its shm prefix)."""
    if server.is_alive():
        return
    left = stub_watch.kill_and_wait(stub_watch.leftover_stubs(server.repo, server.start_time))
    if left:
        raise TrtpdError(f"stubs {left} of the old tritonserver (pid {server.pid}) do not exit; stop them first")
    if port_is_free(server.ports.http, server.host):
        stub_watch.remove_shm(server.shm_prefix)


def down(name: str, timeout_s: float = DOWN_TIMEOUT_S) -> Deployment:
    dep = Deployment.load(name)
    if dep.server.pid_reused():
        dep.note = f"pid {dep.server.pid} is no longer this deployment's tritonserver; nothing signalled"
    stub_watch.mark_stopping(dep.folder)   # an orderly stop: the stubs' exits are not deaths
    stop_server(dep.server, timeout_s)     # signals the pid only while it is still our server
    clean_leftovers(dep.server)
    (dep.folder / records.FLEET_FILE).unlink(missing_ok=True)
    return dep


def list_deployments() -> list[Deployment]:
    """The single-server deployments (records.list_fleets() has the fleets)."""
    return [Deployment.of(r) for r in records.list_records() if r.single_server is not None]
