"""The per-request perf outputs: the TTFT breakdown each request carries back from the role models.

The role models (Triton python stub) set them, disagg_bls forwards them, the ensemble and the
rendered repository declare them, the gateway and bench read them. No imports, so the stub, the
gateway and the CLI can all take the names from here.
"""

# output tensor name -> what it holds; all FP32 milliseconds except kv_transfer_bytes (INT64)
PERF_OUTPUTS = ("prefill_queue_ms", "prefill_compute_ms", "kv_transfer_ms", "kv_transfer_bytes", "decode_queue_ms")

# the engine's per-request perf keys (seconds) -> the output tensor (milliseconds); kv_bytes -> kv_transfer_bytes
ENGINE_PERF_MS = {"prefill_queue_s": "prefill_queue_ms", "prefill_compute_s": "prefill_compute_ms",
                  "kv_transfer_s": "kv_transfer_ms", "decode_queue_s": "decode_queue_ms"}

# the TTFT breakdown: the millisecond outputs, in the order a request goes through them
TTFT_PHASES_MS = ("prefill_queue_ms", "prefill_compute_ms", "kv_transfer_ms", "decode_queue_ms")
