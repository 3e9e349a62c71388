"""A streaming load generator over Triton's gRPC stream (tritonclient), open loop.

Requests are sent at their arrival times on one bidirectional stream; every streamed response is
timestamped on arrival. TTFT = first token - send; TPOT = (last - first token) / (tokens - 1).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

from trtpd.perf_outputs import PERF_OUTPUTS


@dataclass
class BenchRequest:
    request_id: str
    prompt: str
    max_tokens: int
    send_at_s: float            # offset from the start of the run
    num_prompt_tokens: int = 0


@dataclass
class RequestResult:
    request_id: str
    num_prompt_tokens: int
    sent_s: float = 0.0
    token_times_s: list[float] = field(default_factory=list)   # one per streamed token (or OpenAI chunk)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    perf: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    done: bool = False
    num_output_tokens: int = 0        # when known apart from the stream (OpenAI usage); 0: one per time stamp

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.sent_s if self.token_times_s else None

    @property
    def num_tokens(self) -> int:
        return self.num_output_tokens or len(self.token_times_s)

    @property
    def tpot_s(self) -> float | None:
        n = self.num_tokens
        return (self.token_times_s[-1] - self.token_times_s[0]) / (n - 1) if n > 1 and self.token_times_s else None

    @property
    def gaps_s(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive streamed tokens (or chunks)."""
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def worst_stall_s(self) -> float | None:
        """The longest gap inside the request (where a long prefill freezes a colocated instance's streams)."""
        gaps = self.gaps_s
        return max(gaps) if gaps else None


def make_inputs(prompt: str, max_tokens: int, stream: bool = True, end_id: int = -1) -> list:
    values = [("text_input", np.array([[prompt.encode()]], dtype=np.object_), "BYTES"),
              ("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
              ("stream", np.array([[stream]], dtype=np.bool_), "BOOL"),
              ("end_id", np.array([[end_id]], dtype=np.int32), "INT32")]
    inputs = []
    for name, value, dtype in values:
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def run_stream(url: str, requests: list[BenchRequest], model: str = "ensemble", timeout_s: float = 300.0,
               on_done: Callable[[RequestResult], None] | None = None) -> list[RequestResult]:
    """Sends `requests` open-loop at their `send_at_s` and waits until all finished (or timeout)."""
    results = {r.request_id: RequestResult(r.request_id, r.num_prompt_tokens) for r in requests}
    lock = threading.Lock()
    all_done = threading.Event()
    remaining = [len(requests)]

    def finish(res: RequestResult) -> None:
        res.done = True
        remaining[0] -= 1
        if on_done:
            on_done(res)
        if remaining[0] == 0:
            all_done.set()

    def callback(result, error) -> None:
        now = time.perf_counter()
        with lock:
            if error is not None:
                rid = getattr(error, "request_id", None)
                res = results.get(rid) if rid else None
                if res is None:   # stream-level error without an id: fail everything pending
                    for res in results.values():
                        if not res.done:
                            res.error = str(error)
                            finish(res)
                elif not res.done:
                    res.error = str(error)
                    finish(res)
                return
            response = result.get_response()
            res = results.get(response.id)
            if res is None or res.done:
                return
            ids = result.as_numpy("output_ids")
            if ids is not None and ids.size:
                tokens = [int(t) for t in ids.reshape(-1)]
                res.token_ids += tokens
                res.token_times_s += [now] * len(tokens)
            text = result.as_numpy("text_output")
            if text is not None and text.size:
                res.text += b"".join(t if isinstance(t, bytes) else str(t).encode() for t in text.reshape(-1)).decode(
                    "utf-8", errors="replace")
            for name in PERF_OUTPUTS:
                value = result.as_numpy(name)
                if value is not None and value.size:
                    res.perf[name] = float(value.reshape(-1)[0])
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                finish(res)

    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=callback)
    try:
        start = time.perf_counter()
        for req in sorted(requests, key=lambda r: r.send_at_s):
            delay = start + req.send_at_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            with lock:
                results[req.request_id].sent_s = time.perf_counter()
            client.async_stream_infer(model, make_inputs(req.prompt, req.max_tokens), request_id=req.request_id,
                                      enable_empty_final_response=True)
        if not all_done.wait(timeout_s):
            with lock:
                for res in results.values():
                    if not res.done:
                        res.error = f"no final response within {timeout_s:.0f} s"
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return [results[r.request_id] for r in requests]
