"""A fleet of trtllm-serve workers (`trtpd up --fleet --backend trtllm-serve`), each its own process on its own port
and cores: on the CPU, trtpd's twin of a worker (trtpd/serve_twin) with the role's `--extra_llm_api_options` YAML;
with a GPU inventory (`--gpus`, a spec's `gpus:`), the real `trtllm-serve <checkpoint> --backend pytorch ...` that
`trtpd build` rendered (fleet/gpu_workers.py), `CUDA_VISIBLE_DEVICES` its own GPU set. One starter for both: only
the command and the environment differ. The gateway reaches them over trtllm-serve's HTTP protocol
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
from trtpd.errors import ConfigError, TrtpdError
from trtpd.fleet.gpu_workers import KV_ENV, GpuWorkers
from trtpd.fleet.gpus import cuda_visible_devices
from trtpd.fleet.instance import HOST, InstancePlan, instance_folder
from trtpd.fleet.records import FleetRecord, InstanceRecord
from trtpd.fleet.tritonserver import (ServerError, ServerPorts, ServerProcess, ServerStartError, log_tail,
                                      port_is_free, stop_server)
from trtpd.trtllm.serve_config import UCX_ENV

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
    """Starts, waits for and stops trtllm-serve workers (the launcher's Starter): the CPU twin, or with `gpus` the
    real worker on each instance's GPU set (InstancePlan.gpus)."""

    def __init__(self, spec: ReferenceDeployment, transceiver: str | None = "default",
                 gpus: GpuWorkers | None = None) -> None:
        """transceiver: cache_transceiver_config.backend (default, ucx, nixl, mpi; the twin moves KV over TCP; with
        gpus, None keeps the build's). gpus: real workers as `trtpd build`'s serve-pytorch/ starts them."""
        self.spec = spec
        self.transceiver = transceiver
        self.gpus = gpus

    @property
    def start_timeout_s(self) -> float | None:
        """How long a worker may take to answer /health (None: the caller's default)."""
        return self.gpus.start_timeout_s if self.gpus is not None else None

    def start(self, fleet: FleetRecord, plan: InstancePlan) -> InstanceRecord:
        folder = instance_folder(fleet, plan.name)
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        options = folder / f"{plan.role}.yaml"
        port = plan.ports.http
        if not port_is_free(port, HOST):
            raise ServerError(f"port {port} on {HOST} is in use")
        shm_prefix = f"trtpd{port}_{secrets.token_hex(3)}_"   # never empty: stop_server removes /dev/shm/<prefix>*
        env = {**os.environ, "TRTPD_SHM_PREFIX": shm_prefix}
        if self.gpus is None:
            argv, inst = self._twin(fleet, plan, options)
        else:
            argv, inst = self._on_gpus(fleet, plan, options)
            env.update({**{k: os.environ.get(k, v) for k, v in UCX_ENV.items()}, KV_ENV: fleet.key_file,
                        "CUDA_VISIBLE_DEVICES": cuda_visible_devices(plan.gpus)})
        log_path = folder / "worker.log"
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
        inst.server = server
        return inst

    def _twin(self, fleet: FleetRecord, plan: InstancePlan, options: Path) -> tuple[list[str], InstanceRecord]:
        engine = self.spec.engine(Role(plan.role))
        config = EngineConfig.load(engine)
        options.write_text(yaml.safe_dump(llm_api_options(self.spec, plan.role, config, self.transceiver or "default"),
                                          sort_keys=False))
        argv = [sys.executable, "-m", "trtpd.serve_twin", str(Path(self.spec.build_root).resolve()),
                "--host", HOST, "--port", str(plan.ports.http), "--extra_llm_api_options", str(options),
                "--twin_key_file", fleet.key_file]
        if plan.role in SERVER_ROLE:
            argv += ["--server_role", SERVER_ROLE[plan.role]]
        if plan.step_delay_ms:       # fault injection (a spec's step_delay_ms): the rollout gate's tests
            argv += ["--twin_step_delay_ms", str(plan.step_delay_ms)]
        return argv, InstanceRecord(plan.name, plan.role, config.model, None, str(engine), "tcp", "", "",
                                    list(plan.cpus), config.max_batch_size, config.num_kv_blocks,
                                    config.max_input_len, config.max_seq_len, revision=plan.revision,
                                    protocol=PROTOCOL)

    def _on_gpus(self, fleet: FleetRecord, plan: InstancePlan, options: Path) -> tuple[list[str], InstanceRecord]:
        worker = self.gpus.role(plan.role)
        if len(plan.gpus) != worker.gpus_per_instance:
            raise ConfigError(f"instance {plan.name}: given GPUs {list(plan.gpus)}, but its worker runs "
                              f"tp_size x pp_size = {worker.gpus_per_instance} ({self.gpus.serve_dir}/launch.sh)")
        if plan.step_delay_ms:
            raise ConfigError(f"instance {plan.name}: step_delay_ms is the CPU twin's fault injection; real "
                              f"trtllm-serve workers have no such flag (set it to 0)")
        options.write_text(yaml.safe_dump(self.gpus.role_options(plan.role, self.transceiver,
                                                                 self.spec.kv_transfer_timeout_ms
                                                                 if self.transceiver is not None else None),
                                          sort_keys=False))
        argv = self.gpus.argv(plan.role, HOST, plan.ports.http, options)
        return argv, InstanceRecord(plan.name, plan.role, worker.model_name, None, str(self.gpus.serve_dir), "tcp",
                                    "", "", list(plan.cpus), worker.max_batch_size, 0, worker.max_input_len,
                                    worker.max_seq_len, revision=plan.revision, protocol=PROTOCOL,
                                    gpus=list(plan.gpus))

    def wait_ready(self, inst: InstanceRecord, timeout_s: float) -> None:
        """Until the worker's /health answers 200 (it serves only once its engine is loaded)."""
        server = inst.server
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if server.is_ready():
                return
            if not server.is_alive():
                code = server.exit_status()
                raise ServerStartError(f"instance {inst.name} ({inst.role}): {self._what} exited during "
                                       f"startup (exit code {code}); last log lines ({server.log_path}):\n"
                                       f"{log_tail(server.log_path)}", code, server.log_since_start())
            time.sleep(0.2)
        raise TrtpdError(f"instance {inst.name} ({inst.role}): {self._what} is not ready after "
                         f"{timeout_s:.0f} s; last log lines ({server.log_path}):\n{log_tail(server.log_path)}")

    @property
    def _what(self) -> str:
        return "the trtllm-serve twin" if self.gpus is None else f"trtllm-serve ({' '.join(self.gpus.command)})"

    def stop(self, inst: InstanceRecord) -> None:
        stop_server(inst.server, 10.0 if self.gpus is None else 30.0)
