"""Performance models with known, simple costs, for closed-form checks."""

from __future__ import annotations

from trtpd.sched.continuous import BatchSchedulerConfig
from trtpd.sched.prefill import PrefillSchedulerConfig
from trtpd.sim.cluster import BatchRole, ClusterSpec, KvLinkSpec, PrefillRole


class LinearPerf:
    source = "fake"

    def __init__(self, prefill_fixed_s=0.0, prefill_per_token_s=0.0, decode_fixed_s=0.01,
                 decode_per_seq_s=0.0, decode_per_context_token_s=0.0) -> None:
        self.prefill_fixed_s, self.prefill_per_token_s = prefill_fixed_s, prefill_per_token_s
        self.decode_fixed_s, self.decode_per_seq_s = decode_fixed_s, decode_per_seq_s
        self.decode_per_context_token_s = decode_per_context_token_s

    def prefill_s(self, num_tokens, sum_sq_tokens=None):
        return self.prefill_fixed_s + self.prefill_per_token_s * num_tokens

    def decode_step_s(self, batch_size, total_context_tokens):
        return (self.decode_fixed_s + self.decode_per_seq_s * batch_size
                + self.decode_per_context_token_s * total_context_tokens)


def disagg(perf, num_prefill=1, num_decode=1, prefill_sched=None, decode_batch=64, kv_tokens=10_000_000,
           prefill_kv_tokens=10_000_000, link_bytes_per_s=1e12, link_latency_s=0.0, kv_bytes_per_token=1000,
           first_token_at="decode") -> ClusterSpec:
    sched = prefill_sched or PrefillSchedulerConfig(min_batch_size=1, max_batch_size=1, max_num_tokens=1_000_000)
    return ClusterSpec(
        mode="disaggregated",
        prefill=PrefillRole(num_prefill, perf, prefill_kv_tokens, sched),
        decode=BatchRole(num_decode, perf, kv_tokens, BatchSchedulerConfig(max_batch_size=decode_batch,
                                                                           max_num_tokens=decode_batch)),
        kv_link=KvLinkSpec(link_bytes_per_s, link_latency_s, kv_bytes_per_token),
        first_token_at=first_token_at)


def colocated(perf, num=1, batch=64, max_num_tokens=8192, kv_tokens=10_000_000) -> ClusterSpec:
    return ClusterSpec(mode="colocated", decode=BatchRole(
        num, perf, kv_tokens, BatchSchedulerConfig(max_batch_size=batch, max_num_tokens=max_num_tokens,
                                                   prefill_in_step=True)))
