"""The gateway as a process of the fleet: `start_gateway` runs `python -m trtpd.gateway` for a fleet and
waits for /health; `stop_gateway` stops it by pid, only while the pid is still the process started (start
time). Host-side process control; it never imports the gateway package (the gateway reads fleet.json)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from trtpd.errors import TrtpdError


def start_gateway(fleet_name: str, state_dir: Path, port: int = 0, api_key_file: str | None = None,
                  timeout_s: float = 60.0, extra_args: list[str] | None = None) -> dict:
    """Starts `python -m trtpd.gateway` for a fleet; returns {"pid", "start_time", "host", "port", "log"} once
    /health answers."""
    from trtpd.serving.stub_watch import start_time as process_start_time

    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    port_file, log_path = state_dir / "gateway.port", state_dir / "gateway.log"
    port_file.unlink(missing_ok=True)
    from trtpd.fleet.records import load_fleet

    cmd = [sys.executable, "-m", "trtpd.gateway", "--fleet-file", str(load_fleet(fleet_name).path), "--port", str(port),
           "--port-file", str(port_file), *(["--api-key-file", api_key_file] if api_key_file else []),
           *(extra_args or [])]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "TRTPD_HOME": os.environ.get(
                                    "TRTPD_HOME", str(Path(".trtpd").resolve()))})
    record = {"pid": proc.pid, "start_time": process_start_time(proc.pid), "host": "127.0.0.1", "port": 0,
              "log": str(log_path)}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TrtpdError(f"the gateway exited during start-up (status {proc.returncode}); see {log_path}:\n"
                             f"{log_path.read_text(errors='replace')[-2000:]}")
        if port_file.is_file() and _healthy(record["host"], int(port_file.read_text())):
            record["port"] = int(port_file.read_text())
            return record
        time.sleep(0.1)
    stop_gateway(record)
    raise TrtpdError(f"the gateway did not answer /health within {timeout_s:.0f} s; see {log_path}")


def attach_gateway(fleet, *, port: int = 0, api_key_file: str | None = None,
                   extra_args: list[str] | None = None):
    """Starts the fleet's gateway and records it in fleet.json, so `fleet_down` stops it too; returns the fleet."""
    fleet.gateway = start_gateway(fleet.name, fleet.folder / "gateway", port=port, api_key_file=api_key_file,
                                  extra_args=extra_args)
    fleet.save()
    return fleet


def _healthy(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1.0) as resp:
            return resp.status in (200, 503)
    except urllib.error.HTTPError as exc:
        return exc.code == 503
    except OSError:
        return False


def stop_gateway(record: dict, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, the gateway's pid, only while it is still the process we started."""
    import signal

    from trtpd.serving.stub_watch import is_running

    pid, started = int(record["pid"]), record.get("start_time")
    if not is_running(pid, started):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_running(pid, started):
        _reap(pid)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
