"""The gateway as a process of the fleet, under supervisord (trtpd/fleet/supervisor.py), with the controller
when the deployment has one: `attach_gateway` starts them and waits for /health; supervisord restarts either
one that dies; `stop_gateway` stops it all by pid and start time. Host-side process control; it never imports
the gateway package (the gateway reads fleet.json).

The gateway writes its own runtime record (`gateway/gateway.json`: pid, start time, host, port) each time it
starts, so a restarted gateway is found by its new pid; it keeps the port it was given (clients reconnect to
the same address). The API key (`api.key` in the deployment's folder, 0600) is made on the first start.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from trtpd.errors import TrtpdError
from trtpd.fleet.supervisor import Program, start_supervisor, stop_supervisor
from trtpd.process_identity import stop_process

API_KEY_FILE = "api.key"
STATE_FILE = "gateway.json"


def attach_gateway(fleet, *, port: int = 0, host: str = "127.0.0.1", api_key_file: str | None = None,
                   no_auth: bool = False, extra_args: list[str] | None = None, controller: bool = False,
                   timeout_s: float = 60.0):
    """Starts the fleet's gateway (and its controller process when `controller`) under supervisord and records
    them in fleet.json, so `fleet_down` stops them too; returns the fleet. Without a key file and without
    `no_auth`, the deployment's own api.key is used (made now if missing: `fleet.gateway["new_api_key"]`
    holds it, for the caller to show once; it is not saved)."""
    from trtpd.fleet.instance import pick_port
    from trtpd.gateway.api_keys import check_no_auth, create_api_key_file

    folder = fleet.folder / "gateway"
    folder.mkdir(parents=True, exist_ok=True)
    new_key = None
    if no_auth:
        check_no_auth(host)
    elif api_key_file is None:
        api_key_file = str(fleet.folder / API_KEY_FILE)
        new_key = create_api_key_file(api_key_file)
    port = port or pick_port(set())
    state_file = folder / STATE_FILE
    state_file.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "trtpd.gateway", "--fleet-file", str(fleet.path), "--host", host,
            "--port", str(port), "--state-file", str(state_file),
            *(["--no-auth"] if no_auth else ["--api-key-file", str(api_key_file)]),
            *(["--wait-for-instance-s", "0"] if not controller and "--wait-for-instance-s" not in (extra_args or [])
              else []), *(extra_args or [])]
    programs = [Program("gateway", argv, folder / "gateway.log", priority=100)]
    if controller:
        programs.append(Program("controller", [sys.executable, "-m", "trtpd.controller", "run", "--name", fleet.name],
                                fleet.folder / "controller.log", priority=200))
    # a deployment with a controller has an audit log: supervisord's listener writes deaths and restarts there
    listener = [sys.executable, "-m", "trtpd.controller.supervisor_events", "--name", fleet.name] if controller else None
    fleet.supervisor = start_supervisor(fleet.name, fleet.folder / "supervisor", programs, listener)
    fleet.gateway = {"host": host, "port": port, "log": str(folder / "gateway.log"), "state_file": str(state_file),
                     "api_key_file": None if no_auth else str(api_key_file)}
    fleet.save()
    try:
        fleet.gateway.update(wait_gateway(fleet.gateway, timeout_s))
    except BaseException:
        stop_supervisor(fleet.supervisor)
        raise
    fleet.save()
    if new_key:
        fleet.gateway["new_api_key"] = new_key
    return fleet


def wait_gateway(gateway: dict, timeout_s: float) -> dict:
    """The gateway's runtime record once it answers /health (a supervised gateway that keeps dying fails it)."""
    deadline = time.monotonic() + timeout_s
    log_path = Path(gateway["log"])
    while time.monotonic() < deadline:
        record = running_gateway(gateway)
        if record is not None and _healthy(gateway["host"], int(gateway["port"])):
            return {"pid": record["pid"], "start_time": record["start_time"]}
        time.sleep(0.1)
    tail = log_path.read_text(errors="replace")[-2000:] if log_path.is_file() else ""
    raise TrtpdError(f"the gateway did not answer /health within {timeout_s:.0f} s; see {log_path}:\n{tail}")


def running_gateway(gateway: dict | None) -> dict | None:
    """The gateway process now running (its own runtime record), or None."""
    from trtpd.process_identity import is_running

    if not gateway or not gateway.get("state_file"):
        return None
    try:
        record = json.loads(Path(gateway["state_file"]).read_text())
    except (OSError, ValueError):
        return None
    return record if is_running(int(record["pid"]), record.get("start_time")) else None


def _healthy(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1.0) as resp:
            return resp.status in (200, 503)
    except urllib.error.HTTPError as exc:
        return exc.code == 503
    except OSError:
        return False


def stop_gateway(fleet, timeout_s: float = 10.0) -> None:
    """supervisord first (it stops the controller, then the gateway), then whatever of them still runs (a
    supervisord killed by hand leaves its programs): by pid, only while each is still the process started."""
    stop_supervisor(getattr(fleet, "supervisor", None), timeout_s + 15)
    record = running_gateway(fleet.gateway)
    if record is not None:
        stop_process(int(record["pid"]), record.get("start_time"), timeout_s)


def api_key(fleet) -> str | None:
    """The key trtpd's own clients send to this fleet's gateway (None: it runs with --no-auth)."""
    from trtpd.gateway.api_keys import first_key
    path = (fleet.gateway or {}).get("api_key_file")
    return first_key(path) if path else None
