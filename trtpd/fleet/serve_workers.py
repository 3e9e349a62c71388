"""A fleet of trtllm-serve workers (`trtpd up --fleet --backend trtllm-serve`): on the CPU, trtpd's twin of a
worker (trtpd/serve_twin) per instance, each its own process on its own port and cores, with the role's
`--extra_llm_api_options` YAML; the gateway reaches them over trtllm-serve's HTTP protocol
(trtpd/transports/trtllm_http.py). The fleet's machinery (start order, readiness, restarts on a lost port,
fleet.json, `trtpd down`) is the Triton fleet's: this is its Starter.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import yaml

from trtpd.deploy.spec import ReferenceDeployment
from trtpd.engine.engine_config import EngineConfig, Role
from trtpd.errors import TrtpdError
from trtpd.fleet.instance import HOST, InstancePlan, instance_folder
from trtpd.fleet.records import FleetRecord, InstanceRecord
from trtpd.fleet.tritonserver import (ServerError, ServerPorts, ServerProcess, ServerStartError, log_tail,
                                      port_is_free, stop_server)

PROTOCOL = "trtllm-serve"
SERVER_ROLE = {"prefill": "CONTEXT", "decode": "GENERATION"}    # --server_role (none: colocated)


def llm_api_options(spec: ReferenceDeployment, role: str, config: EngineConfig, transceiver: str = "default") -> dict:
    """The role's --extra_llm_api_options (TensorRT-LLM 1.2.1's keys, docs/serve-twin.md): the KV dtype and block
    size of the engine, a finite KV transfer timeout, the iteration stats the gateway's probe reads, the
    per-request records its TTFT breakdown reads, and the context servers' overlap scheduler off (upstream's
    disaggregated examples do so)."""
    from trtpd.schema.trtllm_serve import PERF_METRICS_MAX_REQUESTS
    options: dict = {"kv_cache_config": {"dtype": config.kv_dtype.value, "tokens_per_block": config.tokens_per_block},
                     "enable_iter_perf_stats": True, "return_perf_metrics": True,
                     "perf_metrics_max_requests": PERF_METRICS_MAX_REQUESTS}
    if role in SERVER_ROLE:
        options["cache_transceiver_config"] = {"backend": transceiver.upper(),
                                               "kv_transfer_timeout_ms": spec.kv_transfer_timeout_ms}
    if role == "prefill":
        options["disable_overlap_scheduler"] = True
    return options


class ServeStarter:
    """Starts, waits for and stops twin workers (the launcher's Starter)."""

    def __init__(self, spec: ReferenceDeployment, transceiver: str = "default") -> None:
        """transceiver: cache_transceiver_config.backend (default, ucx, nixl, mpi; the twin moves KV over TCP)."""
        self.spec = spec
        self.transceiver = transceiver

    def start(self, fleet: FleetRecord, plan: InstancePlan) -> InstanceRecord:
        role = Role(plan.role)
        engine = self.spec.engine(role)
        config = EngineConfig.load(engine)
        folder = instance_folder(fleet, plan.name)
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        options = folder / f"{plan.role}.yaml"
        options.write_text(yaml.safe_dump(llm_api_options(self.spec, plan.role, config, self.transceiver),
                                          sort_keys=False))
        port = plan.ports.http
        if not port_is_free(port, HOST):
            raise ServerError(f"port {port} on {HOST} is in use")
        argv = [sys.executable, "-m", "trtpd.serve_twin", str(Path(self.spec.build_root).resolve()),
                "--host", HOST, "--port", str(port), "--extra_llm_api_options", str(options),
                "--twin_key_file", fleet.key_file]
        if plan.role in SERVER_ROLE:
            argv += ["--server_role", SERVER_ROLE[plan.role]]
        if plan.step_delay_ms:       # fault injection (a spec's step_delay_ms): the rollout gate's tests
            argv += ["--twin_step_delay_ms", str(plan.step_delay_ms)]
        shm_prefix = f"trtpd{port}_{secrets.token_hex(3)}_"   # never empty: stop_server removes /dev/shm/<prefix>*
        log_path = folder / "worker.log"
        env = {**os.environ, "TRTPD_SHM_PREFIX": shm_prefix}
        with open(log_path, "ab") as log:
            log_offset = log.tell()
            log.write(("\n$ " + " ".join(argv) + "\n").encode())
            log.flush()
            cores = set(plan.cpus)
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    cwd=folder, start_new_session=True, umask=0o077,
                                    preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
        from trtpd.process_identity import start_time
        server = ServerProcess(proc.pid, HOST, ServerPorts(port, 0, 0), str(folder), str(log_path), shm_prefix,
                               start_time=start_time(proc.pid) or 0, ready_path="/health")
        server._popen, server._log_offset = proc, log_offset
        return InstanceRecord(plan.name, plan.role, config.model, server, str(engine), "tcp", "", "",
                              list(plan.cpus), config.max_batch_size, config.num_kv_blocks, config.max_input_len,
                              config.max_seq_len, revision=plan.revision, protocol=PROTOCOL)

    def wait_ready(self, inst: InstanceRecord, timeout_s: float) -> None:
        """Until the worker's /health answers 200 (it serves only once its engine is loaded)."""
        server = inst.server
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if server.is_ready():
                return
            if not server.is_alive():
                code = server.exit_status()
                raise ServerStartError(f"instance {inst.name} ({inst.role}): the trtllm-serve twin exited during "
                                       f"startup (exit code {code}); last log lines ({server.log_path}):\n"
                                       f"{log_tail(server.log_path)}", code, server.log_since_start())
            time.sleep(0.2)
        raise TrtpdError(f"instance {inst.name} ({inst.role}): the trtllm-serve twin is not ready after "
                         f"{timeout_s:.0f} s; last log lines ({server.log_path}):\n{log_tail(server.log_path)}")

    def stop(self, inst: InstanceRecord) -> None:
        stop_server(inst.server, 10.0)
