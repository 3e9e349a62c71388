"""Real trtllm-serve workers on GPUs: the command line and options `trtpd build` rendered, one instance at a time.

Every GPU `trtpd build` (also `--configs-only`) writes `engines/<model>/deploy/serve-pytorch/`
(trtpd/trtllm/serve_pytorch.py): per role an `--extra_llm_api_options` YAML and, in launch.sh, the worker's
`CUDA_VISIBLE_DEVICES=<gpus> trtllm-serve <checkpoint> --backend pytorch --tokenizer ... --tp_size N ...
--server_role CONTEXT|GENERATION --disagg_cluster_uri <router> --extra_llm_api_options ./<role>.yaml` line. A fleet
starts the same worker per instance with three changes: its own `--host 127.0.0.1 --port P`, its own GPU set, and
no router: trtpd's gateway finds workers through fleet.json, so `--disagg_cluster_uri` and the YAML's
`disagg_cluster` (a registration with a router that does not run) are left out. Nothing is invented: every other
flag and key is the rendered one, checked again against the options table.

`command` replaces `trtllm-serve` (the tests run `python -m trtpd.serve_twin`, which takes the same command line);
the checkpoint is what launch.sh names (checkpoints/hf-fp8 with FP8, checkpoints/hf for a hub model, else the
model folder itself), refused until checkpoint.sh has finished it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from trtpd.errors import ConfigError
from trtpd.schema.manifest import engine_folder_name, load_manifest
from trtpd.serve_twin.options import KEY_FILE_ENV as KV_ENV   # the twin's key; real trtllm-serve ignores it
from trtpd.trtllm.options import check_args, require_valid
from trtpd.trtllm.serve_config import SERVER_START_TIMEOUT_S
from trtpd.trtllm.serve_pytorch import COMPLETE, SERVER_ROLE

TRTLLM_SERVE = ("trtllm-serve",)
ROLE_OF = {v: k for k, v in SERVER_ROLE.items()}     # CONTEXT -> prefill, GENERATION -> decode
PER_INSTANCE_FLAGS = ("--host", "--port", "--extra_llm_api_options")   # the fleet gives each instance its own
ROUTER_FLAGS = ("--disagg_cluster_uri",)                              # no router: the gateway reads fleet.json


@dataclass(frozen=True)
class RoleWorker:
    """One role's worker as launch.sh starts it."""

    role: str                                   # prefill | decode
    model: str                                  # the checkpoint folder trtllm-serve loads
    args: tuple[tuple[str, str], ...]           # every flag but the per-instance and router ones
    options: dict                               # its --extra_llm_api_options, without disagg_cluster
    max_input_len: int                          # the build's limits, for the gateway's checks
    max_seq_len: int
    max_batch_size: int
    model_name: str

    @property
    def gpus_per_instance(self) -> int:
        flags = dict(self.args)
        return int(flags.get("--tp_size", 1)) * int(flags.get("--pp_size", 1))

    @property
    def tokenizer_dir(self) -> str:
        return dict(self.args).get("--tokenizer", self.model)


@dataclass(frozen=True)
class GpuWorkers:
    """How a fleet starts real workers: the serve folder's roles, the command, the start timeout."""

    serve_dir: Path
    roles: dict[str, RoleWorker]
    command: tuple[str, ...] = TRTLLM_SERVE
    start_timeout_s: float = float(SERVER_START_TIMEOUT_S)   # loading a 70B checkpoint takes minutes

    def role(self, role: str) -> RoleWorker:
        if role not in self.roles:
            raise ConfigError(f"{self.serve_dir}/launch.sh starts no {role} worker (it has "
                              f"{', '.join(self.roles) or 'none'}); serve-pytorch renders context and generation "
                              f"servers: run a disaggregated deployment on GPUs")
        return self.roles[role]

    def argv(self, role: str, host: str, port: int, options_file: Path) -> list[str]:
        w = self.role(role)
        args = [*w.args, ("--host", host), ("--port", str(port)), ("--extra_llm_api_options", str(options_file))]
        require_valid(check_args("trtllm-serve", args), f"trtllm-serve command for {role} (from {self.serve_dir})")
        return [*self.command, w.model, *(t for pair in args for t in pair)]

    def role_options(self, role: str, transceiver: str | None = None, kv_transfer_timeout_ms: int | None = None) \
            -> dict:
        """The role's YAML; a deployment spec's KV transport and timeout replace the build's values."""
        options = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.role(role).options.items()}
        transfer = options.get("cache_transceiver_config")
        if isinstance(transfer, dict) and transceiver is not None:
            transfer["backend"] = transceiver.upper()
        if isinstance(transfer, dict) and kv_transfer_timeout_ms is not None:
            transfer["kv_transfer_timeout_ms"] = kv_transfer_timeout_ms
        return options


def load_gpu_workers(serve_dir: Path | str, command: tuple[str, ...] | list[str] = TRTLLM_SERVE,
                     start_timeout_s: float = float(SERVER_START_TIMEOUT_S)) -> GpuWorkers:
    folder = Path(serve_dir).expanduser().resolve()
    launch = folder / "launch.sh"
    if not launch.is_file():
        raise ConfigError(f"{folder}: no launch.sh here; point --serve-dir (a spec's serve_dir) at the "
                          f"deploy/serve-pytorch/ folder `trtpd build --model MODEL` (or --configs-only) wrote")
    if not command or not all(isinstance(t, str) and t for t in command):
        raise ConfigError(f"serve command {list(command)!r}: give the program and its arguments, e.g. "
                          f"[trtllm-serve] (the default)")
    text = launch.read_text()
    roles: dict[str, RoleWorker] = {}
    for line in text.splitlines():
        tokens = shlex.split(line, comments=True)
        if len(tokens) < 3 or not tokens[0].startswith("CUDA_VISIBLE_DEVICES=") or tokens[1] != "trtllm-serve":
            continue
        worker = _role_worker(folder, tokens[2:], launch)
        roles.setdefault(worker.role, worker)      # every instance of a role runs the same command
    if not roles:
        raise ConfigError(f"{launch}: no `CUDA_VISIBLE_DEVICES=... trtllm-serve ...` worker line; is this a "
                          f"serve-pytorch/ folder from `trtpd build`? (rerun it with --configs-only --force)")
    for worker in roles.values():
        _check_checkpoint(worker, text, folder)
    return GpuWorkers(folder, roles, tuple(command), start_timeout_s)


def _role_worker(folder: Path, tokens: list[str], launch: Path) -> RoleWorker:
    model, rest = tokens[0], tokens[1:]
    if ">" in rest:
        rest = rest[:rest.index(">")]
    if len(rest) % 2:
        raise ConfigError(f"{launch}: cannot read the worker line for {model} (a flag without its value)")
    pairs = [(rest[i], rest[i + 1]) for i in range(0, len(rest), 2)]
    flags = dict(pairs)
    role = ROLE_OF.get(flags.get("--server_role", "").upper())
    if role is None or flags.get("--backend") != "pytorch":
        raise ConfigError(f"{launch}: a worker line without --backend pytorch and --server_role CONTEXT|GENERATION; "
                          f"is this serve-pytorch/?")
    options_file = (folder / flags["--extra_llm_api_options"]).resolve()
    try:
        options = yaml.safe_load(options_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{options_file}: cannot read the {role} options ({exc}); rerun trtpd build") from None
    options.pop("disagg_cluster", None)
    args = tuple(p for p in pairs if p[0] not in PER_INSTANCE_FLAGS + ROUTER_FLAGS)
    tp, pp = int(flags.get("--tp_size", 1)), int(flags.get("--pp_size", 1))
    manifest_dir = folder.parent.parent / engine_folder_name(role, tp, pp)   # engines/<model>/<role>-tp<N>
    try:
        manifest = load_manifest(manifest_dir)
    except ConfigError as exc:
        raise ConfigError(f"{folder}: the {role} worker's build record is missing ({exc}); serve-pytorch/ must "
                          f"stay where trtpd build wrote it, beside {manifest_dir.name}/") from None
    b = manifest.build_config
    return RoleWorker(role, model, args, options, b.max_input_len, b.max_seq_len, b.max_batch_size,
                      manifest.model.name)


def _check_checkpoint(worker: RoleWorker, launch_text: str, folder: Path) -> None:
    """launch.sh's guard, here: a checkpoint that checkpoint.sh makes must be complete; any must exist."""
    if f"{worker.model}/{COMPLETE}" in launch_text and not (Path(worker.model) / COMPLETE).is_file():
        raise ConfigError(f"{worker.model} is not complete (no {COMPLETE}): run {folder}/checkpoint.sh first "
                          f"(where the GPUs are)")
    if not (Path(worker.model) / "config.json").is_file():
        raise ConfigError(f"{worker.model}: no checkpoint here (no config.json); it is what {folder}/launch.sh "
                          f"serves: run checkpoint.sh, or rebuild with --hf-model pointing at the model folder")
