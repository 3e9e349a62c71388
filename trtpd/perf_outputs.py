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

# Milliseconds live only at the Triton tensor edge: what a client of the role models reads off their tensors
# becomes seconds (`_s` keys, as the engine reports them) for everything behind it (the orchestrator, the
# gateway's metrics and samples, POST /admin/generate), and back to the tensors' milliseconds only where a
# Triton response is written (the fleet's Triton entry).
TENSOR_MS_TO_S = {ms: s for s, ms in ENGINE_PERF_MS.items()}
TTFT_PHASES_S = tuple(TENSOR_MS_TO_S[name] for name in TTFT_PHASES_MS)


def perf_from_tensors(values: dict[str, float]) -> dict[str, float]:
    """Tensor name -> value (ms, bytes) to the seconds keys (kv_transfer_bytes stays as it is)."""
    return {TENSOR_MS_TO_S.get(k, k): v / 1000.0 if k in TENSOR_MS_TO_S else v for k, v in values.items()
            if k in TENSOR_MS_TO_S or k == "kv_transfer_bytes"}


def perf_to_tensors(perf: dict[str, float]) -> dict[str, float]:
    """The seconds keys back to the tensors' names and milliseconds."""
    return {ENGINE_PERF_MS.get(k, k): v * 1000.0 if k in ENGINE_PERF_MS else v for k, v in perf.items()
            if k in ENGINE_PERF_MS or k == "kv_transfer_bytes"}
