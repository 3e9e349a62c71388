"""The one Prometheus text parser (prometheus_client's), as the gateway's probes and `trtpd status` read Triton."""

from trtpd.gateway.loads import view_from_metrics
from trtpd.metrics_text import samples

TEXT = """# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="decode",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="decode",request_type="active",version="1"} 2
nv_trt_llm_request_metrics{model="decode",request_type="max",version="1"} 64
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="decode",version="1"} 900
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="decode",version="1"} 1024
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="decode",version="1"} 32
# HELP trtpd_note a label value with a comma and an escaped quote
# TYPE trtpd_note gauge
trtpd_note{instance="a,b",reason="say \\"hi\\""} 1
"""


def test_samples_keep_label_values_whole():
    """The hand-split parsers it replaces cut label values at commas (`instance="a,b"` became two labels)."""
    assert samples(TEXT, "trtpd_note") == [({"instance": "a,b", "reason": 'say "hi"'}, 1.0)]
    assert samples(TEXT, "absent") == []


def test_an_instance_view_from_triton_text():
    view = view_from_metrics("decode-0", "decode", TEXT)
    assert (view.waiting, view.active, view.max_batch_size) == (3, 2, 64)
    assert (view.free_kv_blocks, view.max_kv_blocks, view.tokens_per_block) == (900, 1024, 32)
