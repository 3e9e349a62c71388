"""`trtpd demo`'s options (a light module: `trtpd demo --help` shows these defaults without importing torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class DemoOptions:
    engines_dir: Path = Path("engines")
    model: str = "tiny-llama"
    kv_dtype: str = "fp16"
    kv_transport: str = "shm"
    workload: str = "cpu-demo"
    rate_per_s: float = 3.0
    num_requests: int = 40
    seed: int = 0
    colocated_instances: int = 2
    output: Path = Path("out/demo.json")
    profile: Path | None = None     # None: measure this machine (`trtpd profile --serving`) into PROFILE_NAME
    ttft_slo_s: float = 1.0         # the goodput the prediction is judged on (the fidelity benchmark's SLOs)
    tpot_slo_s: float = 0.04


PROFILE_NAME = "cpu-profile.yaml"   # beside the demo's JSON results


@dataclass
class BenchDefaults:
    """`trtpd bench`'s defaults (shown by --help without importing the load generators)."""

    name: str = "default"
    workload: str = "cpu-demo"
    rates: str = "3"
    num_requests: int = 40
    seed: int = 0
    attainment: float = 0.9
    warmup: int = 1
    timeout_s: float = 300.0
