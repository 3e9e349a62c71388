"""Reads each instance's load from its Triton metrics endpoint (TensorRT-LLM's metric names) into the
routing core's InstanceView; an instance whose endpoint does not answer is unhealthy."""

from __future__ import annotations

from trtpd.metrics_text import fetch, samples
from trtpd.routing.core import InstanceView


def parse_samples(text: str, name: str, model: str | None = None) -> dict[str, float]:
    """{the value of the sample's distinguishing label (kv_cache_block_type / request_type): value}; `model`: only
    that model's samples (a server holding several role models, e.g. a Triton MPI world)."""
    out = {}
    for labels, value in samples(text, name):
        kind = labels.get("kv_cache_block_type") or labels.get("request_type")
        if kind and (model is None or labels.get("model") == model):
            out[kind] = value
    return out


def view_from_metrics(name: str, role: str, text: str, state: str = "ready", model: str | None = None,
                      kv_domain: str = "") -> InstanceView:
    blocks = parse_samples(text, "nv_trt_llm_kv_cache_block_metrics", model)
    requests = parse_samples(text, "nv_trt_llm_request_metrics", model)
    if not blocks:    # the server is up, this role model not (yet)
        return InstanceView(name=name, role=role, state="starting", kv_domain=kv_domain)
    return InstanceView(name=name, role=role, state=state, waiting=int(requests.get("waiting", 0)),
                        active=int(requests.get("active", 0)), free_kv_blocks=int(blocks.get("free", 0)),
                        max_kv_blocks=int(blocks.get("max", 0)), max_batch_size=int(requests.get("max", 0)),
                        tokens_per_block=int(blocks.get("tokens_per", 32)) or 32, kv_domain=kv_domain)


def probe(name: str, role: str, metrics_url: str, timeout_s: float = 1.0, *, model: str | None = None,
          kv_domain: str = "") -> InstanceView:
    """One instance's view now (blocking; the gateway runs it in a thread). `model`: read only that model's
    samples; `kv_domain`: the world it belongs to (InstanceView.kv_domain)."""
    text = fetch(metrics_url, timeout_s)
    if text is None:
        return InstanceView(name=name, role=role, state="unhealthy", kv_domain=kv_domain)
    return view_from_metrics(name, role, text, model=model, kv_domain=kv_domain)
