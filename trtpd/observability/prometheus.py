"""Prometheus for a fleet: a scrape config (the gateway's /metrics and every instance's tritonserver metrics
port, with `instance` and `role` as target labels, plus the alert rules of configs/prometheus/alerts.yml) and
a launcher for Debian's Prometheus 2.42 binary (`/usr/bin/prometheus`, installed by scripts/setup.sh) on
127.0.0.1, started and stopped by pid.

    config = write_config(fleet, state / "prometheus.yml", scrape_interval="1s")
    prom = start_prometheus(config, state)          # waits for /-/ready
    try:
        query(prom.url, "trtpd_gateway_ttft_seconds_count")
    finally:
        stop_prometheus(prom)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from trtpd.errors import TrtpdError
from trtpd.resources import data_dir

PROMETHEUS_BIN = "/usr/bin/prometheus"
PROMTOOL_BIN = "/usr/bin/promtool"
DEFAULT_SCRAPE_INTERVAL = "5s"
GATEWAY_JOB = "trtpd-gateway"
INSTANCE_JOB = "trtpd-instances"
HOST = "127.0.0.1"
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")
_INSTALL_HINT = ("install Debian's `prometheus` package (it ships prometheus and promtool): "
                 "`apt-get install prometheus`, or run ./scripts/setup.sh as root")


def prometheus_configs_dir() -> Path:
    # configs_dir() accepts only its CONFIG_KINDS (trtpd/resources.py), so ask data_dir() directly
    return data_dir("configs") / "prometheus"


def alerts_file() -> Path:
    return prometheus_configs_dir() / "alerts.yml"


def _binary(path: str, what: str) -> str:
    if os.access(path, os.X_OK):
        return path
    found = shutil.which(Path(path).name)
    if found:
        return found
    raise TrtpdError(f"{path} is missing ({what} is not installed and `{Path(path).name}` is not on PATH); "
                     f"{_INSTALL_HINT}")


def prometheus_binary() -> str:
    """The Prometheus server binary, or a TrtpdError naming it and saying how to install it."""
    return _binary(PROMETHEUS_BIN, "Prometheus")


def promtool_binary() -> str:
    return _binary(PROMTOOL_BIN, "promtool")


# ---- config ---------------------------------------------------------------------------------
def _check_duration(name: str, value: str) -> str:
    if not _DURATION.match(value):
        raise TrtpdError(f"{name}={value!r} is not a Prometheus duration (e.g. 1s, 500ms, 1m)")
    return value


def _hostport(url: str) -> tuple[str, str]:
    """'http://127.0.0.1:8002/metrics' -> ('127.0.0.1:8002', '/metrics')."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if not parts.hostname or not parts.port:
        raise TrtpdError(f"metrics URL {url!r} has no host:port")
    return f"{parts.hostname}:{parts.port}", parts.path or "/metrics"


def scrape_configs(fleet) -> list[dict]:
    """Scrape jobs for a FleetRecord: the gateway (if it runs) and every instance.

    honor_labels: the gateway exports trtpd_instance_*{instance, role} and the instances label their role
    metrics with instance and role themselves; those labels are kept as scraped (not renamed exported_*).
    Series without them (the gateway's own metrics, Triton's nv_inference_*) get the target labels."""
    jobs = []
    if fleet.gateway and fleet.gateway.get("port"):
        host = fleet.gateway.get("host") or HOST
        job = {"job_name": GATEWAY_JOB, "metrics_path": "/metrics", "honor_labels": True,
               "static_configs": [{"targets": [f"{host}:{int(fleet.gateway['port'])}"],
                                   "labels": {"instance": "gateway", "fleet": fleet.name}}]}
        if fleet.gateway.get("api_key_file"):   # /metrics needs the API key, as the rest of the API does
            job["authorization"] = {"type": "Bearer", "credentials_file": str(fleet.gateway["api_key_file"])}
        jobs.append(job)
    statics = {}
    for inst in fleet.instances:
        target, path = _hostport(inst.metrics_url)
        statics.setdefault(path, []).append({"targets": [target], "labels": {
            "instance": inst.name, "role": inst.role, "fleet": fleet.name}})
    for i, (path, static) in enumerate(sorted(statics.items())):
        jobs.append({"job_name": INSTANCE_JOB if i == 0 else f"{INSTANCE_JOB}-{i}", "metrics_path": path,
                     "honor_labels": True, "static_configs": static})
    if not jobs:
        raise TrtpdError(f"fleet {fleet.name!r} has neither a gateway nor instances to scrape")
    return jobs


def render_config(fleet, *, scrape_interval: str = DEFAULT_SCRAPE_INTERVAL, evaluation_interval: str | None = None,
                  rule_files: list[str | Path] | None = None) -> str:
    """prometheus.yml (YAML text) for a fleet. rule_files defaults to configs/prometheus/alerts.yml."""
    interval = _check_duration("scrape_interval", scrape_interval)
    evaluation = _check_duration("evaluation_interval", evaluation_interval or scrape_interval)
    rules = [str(Path(p).resolve()) for p in (rule_files if rule_files is not None else [alerts_file()])]
    for path in rules:
        if not Path(path).is_file():
            raise TrtpdError(f"rule file {path} does not exist")
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": evaluation},
        "rule_files": rules,
        "scrape_configs": scrape_configs(fleet),
    }
    header = f"# Prometheus config for trtpd fleet {fleet.name!r} (trtpd.observability.prometheus.render_config)\n"
    return header + yaml.safe_dump(config, sort_keys=False)


def write_config(fleet, path: str | Path, **kw) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(fleet, **kw))
    return path


# ---- process --------------------------------------------------------------------------------
@dataclass
class PrometheusProcess:
    pid: int
    start_time: int | None    # field 22 of /proc/<pid>/stat: a reused pid is not ours
    host: str
    port: int
    config_file: str
    data_dir: str
    log_path: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def to_dict(self) -> dict:
        return asdict(self)


def _get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def start_prometheus(config_file: str | Path, state_dir: str | Path, *, port: int = 0, host: str = HOST,
                     timeout_s: float = 60.0, retention: str = "1d", binary: str | None = None) -> PrometheusProcess:
    """Runs prometheus with this config, its TSDB in state_dir/tsdb, listening on host:port (0: a free port),
    and returns once /-/ready answers 200. Raises TrtpdError (with the log's tail) if it exits or is not
    ready in time; it is stopped then."""
    from trtpd.process_identity import start_time
    from trtpd.fleet.tritonserver import free_port

    if host != HOST:
        raise TrtpdError(f"Prometheus listens on {HOST} only (asked for {host})")
    binary = binary or prometheus_binary()
    state_dir = Path(state_dir)
    data_dir = state_dir / "tsdb"
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "prometheus.log"
    attempts = 1 if port else 3      # a free port can be taken between the pick and the bind: pick again
    for attempt in range(attempts):
        chosen = port or free_port(host)   # (outside the kernel's ephemeral range)
        cmd = [binary, f"--config.file={Path(config_file).resolve()}", f"--storage.tsdb.path={data_dir.resolve()}",
               f"--storage.tsdb.retention.time={retention}", f"--web.listen-address={host}:{chosen}",
               "--log.level=warn"]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        record = PrometheusProcess(proc.pid, start_time(proc.pid), host, chosen, str(config_file), str(data_dir),
                                   str(log_path))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                if "address already in use" in tail and attempt + 1 < attempts:
                    break
                raise TrtpdError(f"prometheus exited during start-up (status {proc.returncode}); see {log_path}:\n"
                                 f"{tail}")
            try:
                if _get(f"{record.url}/-/ready", 1.0)[0] == 200:
                    return record
            except OSError:
                pass
            time.sleep(0.1)
        else:
            stop_prometheus(record)
            raise TrtpdError(f"prometheus did not answer /-/ready within {timeout_s:.0f} s; see {log_path}")
    raise TrtpdError(f"prometheus could not bind a free port on {host}; see {log_path}")


def stop_prometheus(record: PrometheusProcess, timeout_s: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL, by pid, only while the pid is still the process we started."""
    from trtpd.process_identity import is_running

    if not is_running(record.pid, record.start_time):
        _reap(record.pid)
        return
    os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_running(record.pid, record.start_time):
        _reap(record.pid)
        if time.monotonic() > deadline:
            os.kill(record.pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    _reap(record.pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def start_for_fleet(fleet, state_dir: str | Path, *, scrape_interval: str = DEFAULT_SCRAPE_INTERVAL,
                    **kw) -> PrometheusProcess:
    """write_config(fleet, state_dir/prometheus.yml) + start_prometheus."""
    state_dir = Path(state_dir)
    config = write_config(fleet, state_dir / "prometheus.yml", scrape_interval=scrape_interval)
    return start_prometheus(config, state_dir, **kw)


# ---- HTTP API -------------------------------------------------------------------------------
def api(url: str, path: str, params: dict | None = None, timeout_s: float = 5.0) -> dict:
    """GET {url}/api/v1/{path}: the `data` of a success answer; TrtpdError for an error answer."""
    full = f"{url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    status, body = _get(full, timeout_s)
    try:
        answer = json.loads(body)
    except ValueError:
        raise TrtpdError(f"{full}: HTTP {status}, not JSON: {body[:200]!r}") from None
    if status != 200 or answer.get("status") != "success":
        raise TrtpdError(f"{full}: HTTP {status}: {answer.get('errorType')}: {answer.get('error')}")
    return answer["data"]


def query(url: str, promql: str, timeout_s: float = 5.0) -> list[dict]:
    """An instant query's vector result: [{"metric": {...}, "value": [ts, "str"]}, ...]."""
    data = api(url, "query", {"query": promql}, timeout_s)
    if data["resultType"] != "vector":
        raise TrtpdError(f"{promql!r}: a {data['resultType']}, not a vector")
    return data["result"]
