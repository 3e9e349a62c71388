"""Milliseconds only at the Triton tensor edge: a role model's perf tensors become seconds behind it, and back."""

from trtpd.perf_outputs import PERF_OUTPUTS, TTFT_PHASES_S, perf_from_tensors, perf_to_tensors


def test_tensor_milliseconds_become_seconds_and_back():
    tensors = {"prefill_queue_ms": 12.0, "prefill_compute_ms": 30.0, "kv_transfer_ms": 4.0, "kv_transfer_bytes": 2048.0,
               "decode_queue_ms": 1.5}
    assert set(tensors) == set(PERF_OUTPUTS)
    perf = perf_from_tensors({**tensors, "output_ids": 7})          # not a perf output: left behind
    assert perf == {"prefill_queue_s": 0.012, "prefill_compute_s": 0.03, "kv_transfer_s": 0.004,
                    "kv_transfer_bytes": 2048.0, "decode_queue_s": 0.0015}
    assert set(TTFT_PHASES_S) == {"prefill_queue_s", "prefill_compute_s", "kv_transfer_s", "decode_queue_s"}
    assert perf_to_tensors(perf) == tensors
