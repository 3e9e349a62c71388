"""A Triton MPI world on this machine's GPUs, as the controller starts one per revision (backend tensorrt-llm with a
spec's `gpus` section): trtpd/trtllm/world.py renders the build's repository and launch script for the revision's
counts into the instance's own folder, and the script's `exec mpirun ...` is the process the executor watches,
signals and stops (rank 0's tritonserver answers on the instance's ports; `CUDA_VISIBLE_DEVICES` is the world's GPU
set, which the script exports before mpirun). The CPU stand-in is fleet/instance.py's start_world.

Not run here past the script's tritonserver guard (no GPU, no TensorRT-LLM): the rendering is pinned by
tests/unit/trtllm/test_world.py, the start (GPU sets, the script run, fleet.json) by
tests/unit/controller/test_worlds.py; what only a GPU box shows is listed in docs/worlds.md.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from trtpd.fleet.instance import HOST, InstancePlan, instance_folder
from trtpd.fleet.records import FleetRecord, InstanceRecord
from trtpd.fleet.tritonserver import ServerError, ServerProcess, port_is_free
from trtpd.schema.fleet_file import WORLD
from trtpd.trtllm.launch import TritonPorts
from trtpd.trtllm.world import WorldLaunch, read_build, render_world

WORLD_DIR = "world"           # the rendered world, inside the instance's folder (instance names are never reused)
ROLES = ("prefill", "decode")


def render_instance_world(fleet: FleetRecord, plan: InstancePlan, deploy_dir: Path,
                          counts: dict[str, int]) -> WorldLaunch:
    """The world of instance `plan` (its GPU set plan.gpus, its ports), rendered into its folder."""
    folder = instance_folder(fleet, plan.name)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    ports = TritonPorts(plan.ports.http, plan.ports.grpc, plan.ports.metrics)
    return render_world(deploy_dir, counts, tuple(plan.gpus), folder / WORLD_DIR, ports)


def start_gpu_world(fleet: FleetRecord, plan: InstancePlan, deploy_dir: Path, counts: dict[str, int]) -> InstanceRecord:
    """Renders and starts the world (returns without waiting for readiness: the executor's observation does)."""
    for port in (plan.ports.http, plan.ports.grpc, plan.ports.metrics):
        if not port_is_free(port, HOST):
            raise ServerError(f"port {port} on {HOST} is in use")
    world = render_instance_world(fleet, plan, deploy_dir, counts)
    build = read_build(deploy_dir)
    limits = {role: build.manifests[role].build_config for role in ROLES}
    log_path = world.folder / "world.log"
    with open(log_path, "ab") as log:
        log_offset = log.tell()
        log.write(f"\n$ bash {world.script}\n".encode())
        log.flush()
        cores = set(plan.cpus)
        proc = subprocess.Popen(["bash", str(world.script)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=world.folder, start_new_session=True, umask=0o077,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    from trtpd.process_identity import start_time
    # the python backend's shared memory of every rank starts with the world's prefix (world.py: per http port)
    server = ServerProcess(proc.pid, HOST, plan.ports, str(world.repo), str(log_path),
                           f"trtpd{plan.ports.http}_rank", start_time=start_time(proc.pid) or 0)
    server._popen, server._log_offset = proc, log_offset
    return InstanceRecord(plan.name, WORLD, "ensemble", server, str(deploy_dir), "mpi", "", "", list(plan.cpus),
                          limits["decode"].max_batch_size, 0, min(b.max_input_len for b in limits.values()),
                          limits["decode"].max_seq_len, revision=plan.revision, gpus=list(plan.gpus),
                          world_roles=list(ROLES))
