"""Hardware profiles: what a roofline needs (FLOPs, HBM bandwidth, memory, links) plus measured curves.

One YAML file per device under configs/hardware/. Bandwidths are per device and per direction.
A profile may carry `measured` curves (written by `trtpd profile`); the planner prefers them to the
roofline for the model, TP and KV dtype they were measured with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtpd.errors import ConfigError
from trtpd.perf.measured import MeasuredProfile
from trtpd.perf.yaml_io import config_path, dump_yaml, load_yaml_model
from trtpd.resources import configs_dir

HARDWARE_DIR = configs_dir("hardware")

ComputeDtype = Literal["fp32", "fp16", "bf16", "fp8"]


class HardwareProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    kind: Literal["gpu", "cpu"] = "gpu"
    description: str = ""
    memory_gb: float = Field(gt=0, description="device memory, decimal GB (1e9 bytes)")
    peak_flops_per_s: dict[ComputeDtype, float] = Field(description="dense peak, per device, by compute dtype")
    hbm_bandwidth_bytes_per_s: float = Field(gt=0)
    nvlink_bandwidth_bytes_per_s: float = Field(ge=0, description="per device, one direction; 0 = no NVLink")
    network_bandwidth_bytes_per_s: float = Field(gt=0, description="per device NIC, one direction")
    max_devices_per_node: int = Field(default=8, gt=0)
    supports_fp8: bool = True
    compute_efficiency: float = Field(default=0.6, gt=0, le=1, description="achieved share of peak FLOPs (MFU)")
    hbm_efficiency: float = Field(default=0.8, gt=0, le=1, description="achieved share of HBM bandwidth")
    link_efficiency: float = Field(default=0.8, gt=0, le=1, description="achieved share of link bandwidth")
    allreduce_latency_s: float = Field(default=10e-6, ge=0, description="fixed cost of one TP all-reduce")
    prefill_overhead_s: float = Field(default=2e-3, ge=0, description="fixed cost per prefill batch")
    decode_overhead_s: float = Field(default=1e-3, ge=0, description="fixed cost per decode step")
    memory_reserved_fraction: float = Field(default=0.1, ge=0, lt=1,
                                            description="memory kept for activations and the runtime")
    sources: list[str] = Field(default_factory=list)
    notes: str = ""
    measured: list[MeasuredProfile] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "HardwareProfile":
        for dtype, flops in self.peak_flops_per_s.items():
            if flops <= 0:
                raise ValueError(f"peak_flops_per_s.{dtype} must be positive")
        if "fp8" in self.peak_flops_per_s and not self.supports_fp8:
            raise ValueError("peak_flops_per_s lists fp8 but supports_fp8 is false")
        return self

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    def flops_per_s(self, dtype: str) -> float:
        if dtype not in self.peak_flops_per_s:
            have = ", ".join(self.peak_flops_per_s)
            raise ConfigError(f"hardware {self.name!r}: no peak_flops_per_s for {dtype!r} (has {have}); "
                              f"choose another weight dtype or add the figure to the profile")
        return self.peak_flops_per_s[dtype]

    def default_weight_dtype(self, preferred: str) -> str:
        """`preferred` when this hardware has a peak figure for it, else the first dtype it has one for (the
        cpu-reference profile has only fp32: the planner's fp8 default rejected every TP on it)."""
        return preferred if preferred in self.peak_flops_per_s or not self.peak_flops_per_s \
            else next(iter(self.peak_flops_per_s))

    def default_kv_dtype(self, model: str, preferred: str) -> str:
        """`preferred` unless this profile measured `model` only at other KV dtypes: then the first of those (a
        profile from `trtpd profile` on the fp16 reference engines has fp16 curves, and the planner's fp8 default
        fell back to the roofline beside them)."""
        kv = [p.kv_dtype for p in self.measured if p.model == model]
        return preferred if not kv or preferred in kv else kv[0]

    def find_measured(self, model: str, tp: int, kv_dtype: str) -> MeasuredProfile | None:
        for profile in self.measured:
            if profile.model == model and profile.tp == tp and profile.kv_dtype == kv_dtype:
                return profile
        return None


def this_host() -> str:
    """How `trtpd profile` names the machine it measures (a profile's `host`): its name, CPU model and the cores
    this process may use, so that another machine of the same name reads as another machine."""
    import os
    import platform
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.node()} ({cpu}, {cores} cores)"


def curves_origin(hardware: HardwareProfile, model: str, kv_dtype: str | None = None) -> str | None:
    """Where `hardware`'s measured curves for `model` (at `kv_dtype`, when given) come from (each entry's host and
    date, and whether that is this machine), or None when it has none (the roofline estimate is used)."""
    entries = [p for p in hardware.measured if p.model == model and kv_dtype in (None, p.kv_dtype)]
    if not entries:
        return None
    where = sorted({f"{p.host or 'an unnamed host'} at {p.measured_at or 'an unrecorded time'}" for p in entries})
    here = this_host()
    verdict = ("this machine" if all(p.host == here for p in entries)
               else f"not this machine ({here}): run `trtpd profile` here for curves of this machine")
    return f"{hardware.name}'s curves for {model} were measured on {'; '.join(where)}; {verdict}"


def hardware_names() -> list[str]:
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))


def hardware_path(name_or_path: str) -> Path:
    return config_path("hardware", name_or_path, HARDWARE_DIR, lower=True)


def load_hardware(name_or_path: str) -> HardwareProfile:
    return load_yaml_model(HardwareProfile, hardware_path(name_or_path))


def save_hardware(profile: HardwareProfile, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = profile.model_dump(mode="json", exclude_defaults=False)
    path.write_text(f"# Hardware profile `{profile.name}`. Schema: trtpd/perf/hardware.py.\n" + dump_yaml(data))
