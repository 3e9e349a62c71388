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


def test_a_world_endpoint_reads_only_its_own_models_series():
    """A Triton MPI world serves prefill and decode from one metrics endpoint: each endpoint's view is its model's
    (without the filter the prefill view took the decode model's queue and KV blocks)."""
    prefill = TEXT.replace('model="decode"', 'model="prefill"').replace("} 3\n", "} 7\n").replace("} 900\n", "} 10\n")
    both = prefill + TEXT.replace("# HELP", "# IGNORED HELP").replace("# TYPE", "# IGNORED TYPE")
    p = view_from_metrics("world-0.prefill", "prefill", both, model="prefill", kv_domain="world-0")
    d = view_from_metrics("world-0.decode", "decode", both, model="decode", kv_domain="world-0")
    assert (p.waiting, p.free_kv_blocks, p.kv_domain) == (7, 10, "world-0")
    assert (d.waiting, d.free_kv_blocks, d.kv_domain) == (3, 900, "world-0")
    assert view_from_metrics("world-0.prefill", "prefill", TEXT, model="prefill").state == "starting"
