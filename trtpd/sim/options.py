"""The simulated cluster's knobs (a light module: `trtpd simulate --help` shows these defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ClusterOptions:
    num_prefill: int = 1
    num_decode: int = 1
    tp_prefill: int = 1
    tp_decode: int = 1
    weight_dtype: str = "fp16"
    kv_dtype: str = "fp16"
    prefill_max_num_tokens: int = 8192
    prefill_max_batch_size: int = 8
    prefill_min_batch_size: int = 2
    bucket_timeout_s: float = 0.005
    decode_max_batch_size: int = 64
    kv_link: Literal["network", "nvlink"] = "network"
    kv_link_bytes_per_s: float | None = None     # one decode instance's ingress; default from the hardware
    kv_link_latency_s: float = 50e-6
    kv_capacity_tokens: int | None = None        # per instance, both roles; default from the perf model
    prefill_kv_capacity_tokens: int | None = None
    decode_kv_capacity_tokens: int | None = None
    colocated_max_batch_size: int | None = None  # default: decode_max_batch_size
    colocated_max_num_tokens: int | None = None  # default: prefill_max_num_tokens
    tokens_per_block: int = 32
    first_token_at: Literal["prefill", "decode"] = "decode"
    colocated_policy: Literal["inflight", "chunked", "prefill_first"] = "inflight"
    tp_colocated: int | None = None              # default: tp_decode
    num_colocated: int | None = None             # default: as many TP-decode instances as the P/D pair's GPUs

    @property
    def colocated_tp(self) -> int:
        return self.tp_colocated or self.tp_decode

    @property
    def num_colocated_instances(self) -> int:
        return self.num_colocated or max(1, self.num_gpus // self.colocated_tp)

    @property
    def num_gpus(self) -> int:
        return self.num_prefill * self.tp_prefill + self.num_decode * self.tp_decode
