"""The GPU inventory: which of this machine's GPUs each worker instance holds (`CUDA_VISIBLE_DEVICES`).

A deployment is given a list of device ids (`trtpd up --fleet --gpus 0,1,2,3`, a spec's `gpus:`); each instance
of a role takes a set of `gpus_per_instance` of them (its tp_size x pp_size), never one a live instance holds, and
gives it back when it stops. The core is pure: the assignments live in fleet.json (each instance record's `gpus`),
so the inventory is rebuilt from the records before every start, and a restarted controller or a second
`trtpd up` sees what the running instances hold. `detect_gpus` (`--gpus auto`) is the one piece that asks the
machine (`nvidia-smi -L`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from trtpd.errors import ConfigError


class GpuShortage(ConfigError):
    """Fewer free GPUs than a start needs."""


@dataclass
class GpuInventory:
    device_ids: tuple[int, ...]                                     # what this deployment may use
    assigned: dict[str, tuple[int, ...]] = field(default_factory=dict)   # instance name -> the GPUs it holds

    def __post_init__(self) -> None:
        if len(set(self.device_ids)) != len(self.device_ids):
            raise ConfigError(f"GPU inventory {list(self.device_ids)}: a device id is listed twice")
        self.device_ids = tuple(sorted(self.device_ids))

    @classmethod
    def from_holders(cls, device_ids: tuple[int, ...], holders: dict[str, list[int] | tuple[int, ...]]) \
            -> "GpuInventory":
        """The inventory with what `holders` (instance name -> GPUs, from fleet.json) hold taken. A holder's GPU
        outside `device_ids` (the inventory shrank under it) stays its own and is simply not free."""
        return cls(tuple(device_ids), {name: tuple(gpus) for name, gpus in holders.items() if gpus})

    @property
    def used_ids(self) -> set[int]:
        return {g for gpus in self.assigned.values() for g in gpus}

    @property
    def free_ids(self) -> tuple[int, ...]:
        used = self.used_ids
        return tuple(g for g in self.device_ids if g not in used)

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def can_assign(self, num_gpus: int) -> bool:
        return 0 < num_gpus <= self.num_free

    def assign(self, name: str, num_gpus: int) -> tuple[int, ...]:
        """The lowest free ids, preferring one contiguous run (neighbouring ids usually share a switch)."""
        if name in self.assigned:
            raise ConfigError(f"instance {name} already holds GPUs {list(self.assigned[name])}")
        if num_gpus < 1:
            raise ConfigError(f"instance {name}: a worker on GPUs needs at least 1 (got {num_gpus})")
        if not self.can_assign(num_gpus):
            raise GpuShortage(self.shortage(f"instance {name}", num_gpus))
        free = self.free_ids
        runs = [free[i:i + num_gpus] for i in range(len(free) - num_gpus + 1)]
        contiguous = [r for r in runs if r[-1] - r[0] == num_gpus - 1]
        gpus = contiguous[0] if contiguous else free[:num_gpus]
        self.assigned[name] = gpus
        return gpus

    def release(self, name: str) -> tuple[int, ...]:
        return self.assigned.pop(name, ())

    def shortage(self, what: str, num_gpus: int) -> str:
        held = ", ".join(f"{n} {list(g)}" for n, g in sorted(self.assigned.items())) or "none"
        return (f"{what} needs {num_gpus} GPU(s) but {self.num_free} of the inventory's {len(self.device_ids)} "
                f"are free (inventory {list(self.device_ids)}; held: {held}); give more GPUs (--gpus / the spec's "
                f"gpus:), or fewer instances or a smaller tp")


def cuda_visible_devices(gpus: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(g) for g in gpus)


def parse_gpus(text: str) -> tuple[int, ...]:
    """`0,1,2,3` (device ids as nvidia-smi numbers them) or `auto` (every GPU nvidia-smi lists)."""
    text = text.strip()
    if text == "auto":
        return detect_gpus()
    parts = [p.strip() for p in text.split(",")]
    if not text or not all(p.isdigit() for p in parts):
        raise ConfigError(f"--gpus {text!r}: give device ids separated by commas (e.g. 0,1,2,3) or auto")
    ids = tuple(int(p) for p in parts)
    GpuInventory(ids)     # refuses duplicates
    return ids


_GPU_LINE = re.compile(r"^GPU (\d+):", re.MULTILINE)


def gpus_from_listing(text: str) -> tuple[int, ...]:
    """The device ids in `nvidia-smi -L` output ("GPU 0: NVIDIA H200 (UUID: ...)", MIG devices indented below)."""
    return tuple(int(m) for m in _GPU_LINE.findall(text))


def detect_gpus() -> tuple[int, ...]:
    if shutil.which("nvidia-smi") is None:
        raise ConfigError("--gpus auto: nvidia-smi is not on PATH (no NVIDIA driver here?); list the device ids "
                          "(--gpus 0,1) or leave --gpus out to run the CPU twin")
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--gpus auto: nvidia-smi -L failed ({exc}); list the device ids instead") from None
    ids = gpus_from_listing(out.stdout) if out.returncode == 0 else ()
    if not ids:
        raise ConfigError(f"--gpus auto: nvidia-smi -L lists no GPU (exit {out.returncode}: "
                          f"{(out.stderr or out.stdout).strip()[:200]}); list the device ids or leave --gpus out")
    return ids
