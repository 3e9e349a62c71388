"""Reads each instance's load from its Triton metrics endpoint (TensorRT-LLM's metric names) into the
routing core's InstanceView; an instance whose endpoint does not answer is unhealthy."""

from __future__ import annotations

from trtpd.metrics_text import fetch, samples
from trtpd.routing.core import InstanceView


def parse_samples(text: str, name: str) -> dict[str, float]:
    """{the value of the sample's distinguishing label (kv_cache_block_type / request_type): value}."""
    out = {}
    for labels, value in samples(text, name):
        kind = labels.get("kv_cache_block_type") or labels.get("request_type")
        if kind:
            out[kind] = value
    return out


def view_from_metrics(name: str, role: str, text: str, state: str = "ready") -> InstanceView:
    blocks = parse_samples(text, "nv_trt_llm_kv_cache_block_metrics")
    requests = parse_samples(text, "nv_trt_llm_request_metrics")
    return InstanceView(name=name, role=role, state=state, waiting=int(requests.get("waiting", 0)),
                        active=int(requests.get("active", 0)), free_kv_blocks=int(blocks.get("free", 0)),
                        max_kv_blocks=int(blocks.get("max", 0)), max_batch_size=int(requests.get("max", 0)),
                        tokens_per_block=int(blocks.get("tokens_per", 32)) or 32)


def probe(name: str, role: str, metrics_url: str, timeout_s: float = 1.0) -> InstanceView:
    """One instance's view now (blocking; the gateway runs it in a thread)."""
    text = fetch(metrics_url, timeout_s)
    if text is None:
        return InstanceView(name=name, role=role, state="unhealthy")
    if "nv_trt_llm_kv_cache_block_metrics{" not in text:   # the server is up, its role model not (yet)
        return InstanceView(name=name, role=role, state="starting")
    return view_from_metrics(name, role, text)
