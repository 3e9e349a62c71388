"""The KV link between a prefill and a decode instance: its bandwidth and the time one transfer takes.

The planner (trtpd.planner.search, .role_models) and the simulator (trtpd.sim.cluster_specs, .decode_instance)
both take them from here, so a plan and its simulation price a transfer the same way.
"""

from __future__ import annotations

from typing import Literal

from trtpd.perf.hardware import HardwareProfile

LinkKind = Literal["network", "nvlink"]


def kv_link_bytes_per_s(hardware: HardwareProfile, kind: str, tp_prefill: int, tp_decode: int) -> float:
    """One decode instance's ingress: the per-device link bandwidth x the devices that move KV in
    parallel (the smaller TP of the pair) x the achieved share of link bandwidth. 0 when there is no such link."""
    per_device = (hardware.nvlink_bandwidth_bytes_per_s if kind == "nvlink"
                  else hardware.network_bandwidth_bytes_per_s)
    return per_device * min(tp_prefill, tp_decode) * hardware.link_efficiency


def kv_transfer_s(num_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """One transfer on an idle link: the fixed cost plus bytes / bandwidth."""
    return latency_s + num_bytes / bytes_per_s
