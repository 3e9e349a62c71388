"""The gateway's Prometheus metrics (prometheus-client), one registry per gateway.

Names (configs/grafana and configs/prometheus build on them):
  trtpd_gateway_ttft_seconds, trtpd_gateway_itl_seconds, trtpd_gateway_tpot_seconds,
  trtpd_gateway_e2e_seconds, trtpd_gateway_worst_stall_seconds            histograms
  trtpd_gateway_ttft_breakdown_seconds{phase=prefill_queue|prefill_compute|kv_transfer|decode_queue}
  trtpd_gateway_kv_transfer_bytes_total, trtpd_gateway_kv_transfer_seconds
  trtpd_gateway_requests_total{endpoint, status}                             status: HTTP status code (499: the
                                                                             client left or stopped reading)
  trtpd_gateway_requests_slo_met_total, trtpd_gateway_requests_finished_total  live goodput = met / finished
  trtpd_gateway_slow_clients_total                                           streams cancelled: client not reading
  trtpd_gateway_inflight_requests, trtpd_gateway_queued_requests             gauges
  trtpd_instance_waiting{instance, role}, trtpd_instance_active{instance, role},
  trtpd_instance_kv_blocks{instance, role, kind=used|free}, trtpd_instance_up{instance, role}
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from trtpd.perf_outputs import TTFT_PHASES_S

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.0)
PHASES = {name: name.removesuffix("_s") for name in TTFT_PHASES_S}   # perf key (seconds) -> phase label


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.ttft = Histogram("trtpd_gateway_ttft_seconds", "Time to first token", buckets=LATENCY_BUCKETS_S,
                              registry=r)
        self.itl = Histogram("trtpd_gateway_itl_seconds", "Inter-token latency (each gap between streamed tokens)",
                             buckets=TOKEN_BUCKETS_S, registry=r)
        self.tpot = Histogram("trtpd_gateway_tpot_seconds", "Time per output token after the first, per request",
                              buckets=TOKEN_BUCKETS_S, registry=r)
        self.e2e = Histogram("trtpd_gateway_e2e_seconds", "Request latency, arrival to last token",
                             buckets=LATENCY_BUCKETS_S, registry=r)
        self.worst_stall = Histogram("trtpd_gateway_worst_stall_seconds", "Longest gap between two tokens of a request",
                                     buckets=LATENCY_BUCKETS_S, registry=r)
        self.breakdown = Histogram("trtpd_gateway_ttft_breakdown_seconds", "TTFT split into its phases",
                                   ["phase"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.kv_bytes = Counter("trtpd_gateway_kv_transfer_bytes", "KV bytes moved from prefill to decode", registry=r)
        self.kv_seconds = Histogram("trtpd_gateway_kv_transfer_seconds", "Time spent moving a request's KV",
                                    buckets=LATENCY_BUCKETS_S, registry=r)
        self.requests = Counter("trtpd_gateway_requests", "Requests answered", ["endpoint", "status"], registry=r)
        self.slo_met = Counter("trtpd_gateway_requests_slo_met", "Finished requests that met both TTFT and TPOT SLOs",
                               registry=r)
        self.finished = Counter("trtpd_gateway_requests_finished", "Requests that finished generating", registry=r)
        self.slow_clients = Counter("trtpd_gateway_slow_clients", "Streams cancelled because the client stopped "
                                    "reading while its buffer filled", registry=r)
        self.inflight = Gauge("trtpd_gateway_inflight_requests", "Requests being served", registry=r)
        self.queued = Gauge("trtpd_gateway_queued_requests", "Requests waiting for a slot", registry=r)
        self.waiting = Gauge("trtpd_instance_waiting", "Requests waiting at an instance", ["instance", "role"],
                             registry=r)
        self.active = Gauge("trtpd_instance_active", "Sequences running at an instance", ["instance", "role"],
                            registry=r)
        self.kv_blocks = Gauge("trtpd_instance_kv_blocks", "KV blocks of an instance", ["instance", "role", "kind"],
                               registry=r)
        self.up = Gauge("trtpd_instance_up", "1 if the instance answered its last probe", ["instance", "role"],
                        registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
