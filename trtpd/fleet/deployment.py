"""Named local deployments: render a repository, run tritonserver for it, remember it, stop it.

State lives under $TRTPD_HOME (default ./.trtpd): deployments/<name>/ holds the rendered
repository, its KV key, the server log, deployment.json (pid and start time, ports, mode) and the
stubs' registry and death record (stub_watch.py). A pid is signalled only while its start time is
the one recorded at `up`; `up` first removes what a crashed deployment of the same name left behind.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from trtpd.errors import TrtpdError
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.repo.reference import render_reference_repository
from trtpd.serving import stub_watch
from trtpd.fleet.tritonserver import (ServerPorts, ServerProcess, port_is_free, start_server, start_until_ready,
                                        stop_server)

# tritonserver's own exit timeout is 3 s (tritonserver.EXIT_TIMEOUT_S) for in-flight requests; a server still
# finalizing its python stubs 1 s after that is killed (its group too), so `down` ends in seconds under load
DOWN_TIMEOUT_S = 6.0


def trtpd_home() -> Path:
    return Path(os.environ.get("TRTPD_HOME", ".trtpd")).resolve()


def deployment_dir(name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise TrtpdError(f"deployment name {name!r}: use letters, digits, '-' or '_'")
    return trtpd_home() / "deployments" / name


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
    name: str
    mode: str
    server: ServerProcess
    started_at: float
    build_root: str
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

    def save(self) -> None:
        path = deployment_dir(self.name) / "deployment.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)   # owner only, like the rest of the folder
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"name": self.name, "mode": self.mode, "server": self.server.to_dict(),
                                "started_at": self.started_at, "build_root": self.build_root}, indent=2))

    @classmethod
    def load(cls, name: str) -> "Deployment":
        path = deployment_dir(name) / "deployment.json"
        if not path.is_file():
            raise TrtpdError(f"no deployment named {name!r} (see `trtpd status`)")
        d = json.loads(path.read_text())
        return cls(d["name"], d["mode"], ServerProcess.from_dict(d["server"]), d["started_at"], d["build_root"])


def up(name: str, spec: ReferenceDeployment, *, ports: ServerPorts | None = None, timeout_s: float = 180.0,
       replace: bool = False) -> Deployment:
    folder = deployment_dir(name)
    if (folder / "deployment.json").is_file():
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
        deployments.append(Deployment(name, spec.mode, server, time.time(), str(spec.build_root)))
        deployments[-1].save()        # named on disk at once: `trtpd down` finds it whatever happens next
        return server

    try:
        start_until_ready(start, ports, timeout_s)
    except BaseException:
        (folder / "deployment.json").unlink(missing_ok=True)
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
    (dep.folder / "deployment.json").unlink(missing_ok=True)
    return dep


def list_deployments() -> list[Deployment]:
    root = trtpd_home() / "deployments"
    if not root.is_dir():
        return []
    return [Deployment.load(p.parent.name) for p in sorted(root.glob("*/deployment.json"))]

