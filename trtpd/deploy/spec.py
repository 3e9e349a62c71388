"""The reference backend's deployment spec: engines, instance counts, KV transport, key placement.

A frozen dataclass that the single-server path (trtpd.fleet.deployment), the fleet (trtpd.fleet),
the CLI and bench all pass around; rendering it into a model repository is trtpd.repo.reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtpd.engine.engine_config import Role
from trtpd.errors import ConfigError

MODES = ("disaggregated", "colocated")
KV_TRANSPORTS = ("shm", "tcp", "ucx", "mpi")
KEY_FILE = "kv.key"


@dataclass(frozen=True)
class ReferenceDeployment:
    build_root: Path                 # engines/<model>/reference-<kv>/
    mode: str = "disaggregated"
    kv_transport: str = "shm"
    prefill_instances: int = 1
    decode_instances: int = 1
    colocated_instances: int = 2
    bls_instances: int = 1
    kv_transfer_timeout_ms: int = 30000   # prefill frees KV that decode has not pulled by then
    kv_transfer: str = "layerwise"         # or "after_prefill" (TensorRT-LLM's semantics)
    max_batch_size: int = 64
    prefill_engine: Path | None = None   # override (e.g. a deliberately mismatched decode engine)
    decode_engine: Path | None = None

    def engine(self, role: Role) -> Path:
        override = {Role.PREFILL: self.prefill_engine, Role.DECODE: self.decode_engine}.get(role)
        if override is not None:
            return Path(override).resolve()
        root = Path(self.build_root)
        path = root / f"{role.value}-tp1"
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path}: no {role.value} engine; build it with "
                              f"`trtpd build --backend reference --model <model>`")
        return path.resolve()


def key_file_for(repo_dir: Path) -> Path:
    """The deployment's KV signing key sits next to its repository: <parent>/<repo name>.kv.key."""
    return repo_dir.parent / f"{repo_dir.name}.{KEY_FILE}"
