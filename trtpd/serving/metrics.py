"""Prometheus metrics of a role model, under TensorRT-LLM's Triton metric names, so dashboards and
the autoscaler read the reference backend and the tensorrtllm backend alike."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

BLOCK_KINDS = ("max", "free", "used", "tokens_per", "fraction")
REQUEST_KINDS = ("active", "waiting", "max", "completed")


class RoleModelMetrics:
    def __init__(self, model: str, version: str = "1", instance: str = "", role: str = "") -> None:
        # `instance` and `role` keep two instance servers' series apart (one server: instance = model name)
        base = {"model": model, "version": version, "instance": instance or model, "role": role or model}
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        blocks = pb_utils.MetricFamily(name="nv_trt_llm_kv_cache_block_metrics",
                                       description="TRT LLM KV cache block metrics", kind=gauge)
        requests = pb_utils.MetricFamily(name="nv_trt_llm_request_metrics",
                                         description="TRT LLM request metrics", kind=gauge)
        disagg = pb_utils.MetricFamily(name="nv_trt_llm_disaggregated_serving_metrics",
                                       description="TRT LLM disaggregated serving metrics", kind=counter)
        invariance = pb_utils.MetricFamily(
            name="trtpd_batch_invariance_verified_rows",
            description="Largest forward pass (rows) for which batch invariance was verified at load; "
                        "the engine refuses to load when the check fails", kind=gauge)
        self.families = (blocks, requests, disagg, invariance)   # keep alive: metrics die with their family
        self.blocks = {k: blocks.Metric(labels={**base, "kv_cache_block_type": k}) for k in BLOCK_KINDS}
        self.requests = {k: requests.Metric(labels={**base, "request_type": k}) for k in REQUEST_KINDS}
        self.transfer_ms = disagg.Metric(labels={**base, "disaggregated_serving_type": "kv_cache_transfer_ms"})
        self.transfer_count = disagg.Metric(labels={**base, "disaggregated_serving_type": "request_count"})
        self._invariance_family = invariance
        self._base = base

    def set_batch_invariance(self, max_rows: int, tile_rows: int) -> None:
        self.invariance = self._invariance_family.Metric(labels={**self._base, "tile_rows": str(tile_rows)})
        self.invariance.set(max_rows)

    def update(self, stats: dict, max_batch_size: int) -> None:
        max_blocks = stats["max_blocks"]
        self.blocks["max"].set(max_blocks)
        self.blocks["free"].set(stats["free_blocks"])
        self.blocks["used"].set(stats["used_blocks"])
        self.blocks["tokens_per"].set(stats["tokens_per_block"])
        self.blocks["fraction"].set(stats["used_blocks"] / max_blocks if max_blocks else 0.0)
        self.requests["active"].set(stats["active"])
        self.requests["waiting"].set(stats["waiting"])
        self.requests["max"].set(max_batch_size)
        self.requests["completed"].set(stats["completed"])

    def record_transfer(self, seconds: float) -> None:
        self.transfer_ms.increment(seconds * 1000.0)
        self.transfer_count.increment(1)
