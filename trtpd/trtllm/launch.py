"""The launch script for one MPI world running Triton with the tensorrtllm backend.

Same command shape as TensorRT-LLM's launch_triton_server.py --multi-model
--disable-spawn-processes (trtllm-1.2.md §3.5): env TRTLLM_ORCHESTRATOR=1 and
TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=0; rank 0 (orchestrator) loads the whole repository; every
other rank loads only the role models with --model-control-mode=explicit. trtpd writes the mpirun
command itself instead of calling that script, so the command in the file is the exact one that runs.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from trtpd import __version__
from trtpd.trtllm.containers import CONTAINERS, DEFAULT_CONTAINER
from trtpd.trtllm.mpi_world import RankLayout
from trtpd.trtllm.options import check_args, check_keys, require_valid
from trtpd.trtllm.plan import BuildPlan
from trtpd.trtllm.tokenizer_files import TOKENIZER_DIR, guard_lines
from trtpd.trtllm.transfer_buffer import transfer_buffer_env
from trtpd.trtllm.versions import PINNED

ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "0"}
PYTHON_DIR = "python"       # the deploy folder's copy of trtpd, for the python models (deploy.write_python_package)


@dataclass(frozen=True)
class TritonPorts:
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002

    def as_dict(self) -> dict[str, int]:
        return {"triton http": self.http_port, "triton grpc": self.grpc_port, "triton metrics": self.metrics_port}


def rank_args(rank: int, repo: Path, ports: TritonPorts, role_models: list[str],
              shm_prefix: str = "prefix") -> list[tuple[str, str | None]]:
    """`shm_prefix`: the python backend's shared-memory names start with it and the rank; a second world on the
    host needs its own (fleet/tritonserver.py keys a server's by its port for the same reason)."""
    args: list[tuple[str, str | None]] = [
        ("--model-repository", str(repo)), ("--http-port", str(ports.http_port)),
        ("--grpc-port", str(ports.grpc_port)), ("--metrics-port", str(ports.metrics_port)),
        ("--disable-auto-complete-config", None),
        ("--backend-config", f"python,shm-region-prefix-name={shm_prefix}{rank}_"),
    ]
    if rank > 0:
        args.append(("--model-control-mode", "explicit"))
        args.extend(("--load-model", name) for name in role_models)
    require_valid(check_args("tritonserver", args), f"tritonserver command for MPI rank {rank}")
    return args


def mpirun_lines(world: RankLayout, repo: Path, ports: TritonPorts, role_models: list[str],
                 env: dict[str, str], shm_prefix: str = "prefix") -> list[str]:
    head = [("--allow-run-as-root", None)] + [("-x", name) for name in env]
    require_valid(check_args("mpirun", head + [("-n", "1")]), "mpirun command")
    require_valid(check_keys("env", env), "launch environment")
    lines = ["mpirun " + " ".join(f if v is None else f"{f} {v}" for f, v in head)]
    for rank in range(world.world_size):
        args = rank_args(rank, repo, ports, role_models, shm_prefix)
        args = " ".join(f if v is None else f"{f}={shlex.quote(v)}" for f, v in args)
        lines.append(("" if rank == 0 else ": ") + f"-n 1 {PINNED.tritonserver_bin} {args}")
    return lines


PTH_NAME = "trtpd-deploy.pth"


def install_python_package_lines() -> list[str]:
    """Shell lines (after DEPLOY_DIR is set) that make the deploy folder's trtpd copy importable by the models.

    The python-backend stub embeds Python in isolated mode, so PYTHONPATH is ignored; it takes the
    site-packages of the `python3` first on PATH (environment.md, python-backend pitfall 1): in the Triton
    26.04 trtllm container /opt/venv-tritonserver (backend Dockerfile at r26.04 ce68ff5: `python3.12 -m venv
    /opt/venv-tritonserver`, its bin/ first on PATH). A .pth file there adds python/ to that interpreter's sys.path, also in isolated
    mode; nothing is pip-installed and no network is needed. The check runs python3 -I, as the stub does.
    """
    src = f"$DEPLOY_DIR/{PYTHON_DIR}"
    return [
        "# The python models (preprocessing, postprocessing, disagg_bls) import trtpd.serving, which neither container",
        f"# has: a {PTH_NAME} in the site-packages of the python3 on PATH (the one the python-backend stub uses; it",
        f"# ignores PYTHONPATH) puts this folder's copy, {PYTHON_DIR}/, on its sys.path.",
        f'if [ ! -f "{src}/trtpd/serving/bls_model.py" ]; then',
        f'  echo "launch_triton.sh: {src}/trtpd is missing; rerun trtpd build --configs-only" >&2',
        "  exit 1",
        "fi",
        'SITE_PACKAGES="$(python3 -c \'import sysconfig; print(sysconfig.get_paths()["purelib"])\')"',
        f'echo "{src}" > "$SITE_PACKAGES/{PTH_NAME}" || {{',
        f'  echo "launch_triton.sh: cannot write $SITE_PACKAGES/{PTH_NAME}; run as the container\'s root" >&2; exit 1; }}',
        f'if ! TRTPD_SRC="{src}" python3 -I -c \'import os, trtpd; '
        f'raise SystemExit(not trtpd.__file__.startswith(os.environ["TRTPD_SRC"] + "/"))\'; then',
        f'  echo "launch_triton.sh: python3 -I does not import trtpd from {src} (another trtpd installed in '
        f'$SITE_PACKAGES?)" >&2',
        "  exit 1",
        "fi",
    ]


# The version trtpd's own environment pins (pyproject.toml); Triton's gRPC inference protocol (KServe v2,
# grpc_service.proto) is the same for the 26.04 server.
TRITONCLIENT = "2.73.0"
DEPS_DIR = "python-deps"


def grpc_client_lines() -> list[str]:
    """Shell lines (after install_python_package_lines) that make tritonclient's gRPC client importable by the
    python models: the ensemble's disagg_bls reaches this server's role models over its own gRPC endpoint with it
    (trtpd/serving/bls_model.py: BLS corrupts the python backend's heap under concurrent requests). Whether the
    26.04 container's venv has it is not checked here; where it lacks it, it goes into the deploy folder's
    python-deps/ (pip --target: the container's own site-packages stay as they are), listed in the .pth after
    trtpd's copy. A container whose own packages clash with it (protobuf older than tritonclient's >= 6.30) fails
    the check, and the script stops naming it."""
    deps = f"$DEPLOY_DIR/{DEPS_DIR}"
    check = "python3 -I -c 'import tritonclient.grpc.aio'"
    return [
        f"if ! {check} 2>/dev/null; then",
        f'  echo "launch_triton.sh: installing tritonclient[grpc]=={TRITONCLIENT} into {deps} (disagg_bls reaches the '
        f'role models over gRPC)" >&2',
        f'  python3 -m pip install --quiet --target "{deps}" "tritonclient[grpc]=={TRITONCLIENT}" || {{',
        f'    echo "launch_triton.sh: pip could not install tritonclient[grpc]=={TRITONCLIENT}; install it for python3 '
        f'on PATH ($SITE_PACKAGES) and rerun" >&2; exit 1; }}',
        f'  echo "{deps}" >> "$SITE_PACKAGES/{PTH_NAME}"',
        f"  if ! {check}; then",
        f'    echo "launch_triton.sh: python3 -I cannot import tritonclient.grpc.aio from {deps} (see the error above; '
        f'a protobuf older than 6.30 in $SITE_PACKAGES?)" >&2',
        "    exit 1",
        "  fi",
        "fi",
    ]


def tritonserver_guard_lines() -> list[str]:
    """Stop at once, naming the image to use, where this image has no tritonserver (TensorRT-LLM's release
    image has none; trtllm/containers.py)."""
    image = CONTAINERS[DEFAULT_CONTAINER].image
    return [
        f"if [ ! -x {PINNED.tritonserver_bin} ]; then",
        f'  echo "launch_triton.sh: {PINNED.tritonserver_bin} is not in this image; run this script in {image}" >&2',
        "  exit 1",
        "fi",
    ]


def _rank_table(world: RankLayout) -> list[str]:
    rows = ["#   rank 0: orchestrator (no GPU); serves every endpoint and loads every model"]
    for inst in (*world.prefill, *world.decode):
        first, last = inst.ranks[0], inst.ranks[-1]
        ranks = f"rank {first}" if first == last else f"ranks {first}-{last}"
        rows.append(f"#   {ranks}: {inst.role} instance {inst.index} on GPU(s) {','.join(map(str, inst.gpu_ids))}")
    return rows


def render_triton_launch(plan: BuildPlan, world: RankLayout, repo: Path, ports: TritonPorts, *,
                         deploy_dir: Path | None = None, cuda_visible_devices: str | None = None,
                         shm_prefix: str = "prefix") -> str:
    """For a world rendered beside the build's (trtllm/world.py): `deploy_dir`, the folder holding python/ and
    tokenizer/ (default: the script's own, as `trtpd build` writes it); `cuda_visible_devices`, exported before
    mpirun, the ranks' gpu_device_ids then index into it; `shm_prefix` (rank_args)."""
    r = plan.request
    terms = " + ".join(f"{s.instances} x {s.role} TP{s.tp_size}*PP{s.pp_size}" for s in r.roles)
    role_models = [s.role for s in r.roles]
    buffer = transfer_buffer_env(plan)
    body = " \\\n    ".join(mpirun_lines(world, repo, ports, role_models, {**ORCHESTRATOR_ENV, **buffer},
                                                 shm_prefix))
    devices = {} if cuda_visible_devices is None else {"CUDA_VISIBLE_DEVICES": cuda_visible_devices}
    exports = "\n".join([f"export {k}={v}" for k, v in {**ORCHESTRATOR_ENV, **buffer, **devices}.items()])
    here = '"$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"'
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# Disaggregated Triton deployment of {r.model.name}: one MPI world of {world.world_size} ranks.",
        f"# Generated by trtpd {__version__} for TensorRT-LLM {PINNED.tensorrt_llm} "
        f"in {CONTAINERS[DEFAULT_CONTAINER].image}.",
        f"# world_size = {terms} + 1 orchestrator = {world.world_size}",
        *_rank_table(world),
        "# The KV cache moves over MPI: the tensorrtllm backend hard-codes the MPI transceiver, so every",
        "# executor shares this world and OpenMPI must be CUDA-aware and built with UCX.",
        "# Worker ranks get rank 0's ports, as launch_triton_server.py does: they stay in the executor",
        "# worker loop while loading their models and never open endpoints.",
        "# TensorRT-LLM 1.2.1 has no KV-transfer timeout or transport setting on this path (the backend hard-codes",
        "# CacheTransceiverConfig(MPI)): if a rank dies, mpirun ends the whole world, so rerun this script; if one",
        "# hangs, kill and rerun it. No compiled-engine path of 1.2.1 enforces kv_transfer_timeout_ms (trtllm-serve",
        "# --backend tensorrt does not either; trtpd lint explains). The KV staging buffer is sized by",
        "# TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE (default 512MB, every transport): set below to the longest prompt's",
        "# KV plus one block on one rank of the role holding the most (trtpd/trtllm/transfer_buffer.py).",
        "set -euo pipefail",
        *tritonserver_guard_lines(),
        exports,
        "DEPLOY_DIR=" + (here if deploy_dir is None else shlex.quote(str(deploy_dir))),
        *guard_lines("launch_triton.sh", "$DEPLOY_DIR/" + TOKENIZER_DIR),
        *install_python_package_lines(),
        *grpc_client_lines(),
        f"exec {body}",
        "",
    ])
