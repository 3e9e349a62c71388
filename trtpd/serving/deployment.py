"""Named local deployments: render a repository, run tritonserver for it, remember it, stop it.

State lives under $TRTPD_HOME (default ./.trtpd): deployments/<name>/ holds the rendered
repository, its KV key, the server log and deployment.json (pid, ports, mode).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from trtpd.errors import TrtpdError
from trtpd.repo.reference import ReferenceDeployment, render_reference_repository
from trtpd.serving.tritonserver import ServerPorts, ServerProcess, start_server, stop_server, wait_ready


def trtpd_home() -> Path:
    return Path(os.environ.get("TRTPD_HOME", ".trtpd")).resolve()


def deployment_dir(name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise TrtpdError(f"deployment name {name!r}: use letters, digits, '-' or '_'")
    return trtpd_home() / "deployments" / name


@dataclass
class Deployment:
    name: str
    mode: str
    server: ServerProcess
    started_at: float
    build_root: str

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
            stop_server(existing.server)
    folder.mkdir(parents=True, exist_ok=True)
    repo = render_reference_repository(spec, folder / "repo", overwrite=True)
    server = start_server(repo, folder, ports=ports, log_path=folder / "tritonserver.log")
    dep = Deployment(name, spec.mode, server, time.time(), str(spec.build_root))
    dep.save()
    try:
        wait_ready(server, timeout_s)
    except BaseException:
        stop_server(server)
        (folder / "deployment.json").unlink(missing_ok=True)
        raise
    return dep


def down(name: str, timeout_s: float = 30.0) -> Deployment:
    dep = Deployment.load(name)
    stop_server(dep.server, timeout_s)
    (deployment_dir(name) / "deployment.json").unlink(missing_ok=True)
    return dep


def list_deployments() -> list[Deployment]:
    root = trtpd_home() / "deployments"
    if not root.is_dir():
        return []
    return [Deployment.load(p.parent.name) for p in sorted(root.glob("*/deployment.json"))]

