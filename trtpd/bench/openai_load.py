"""An open-loop load generator over the OpenAI API (the official `openai` client, streaming completions).

Each request is sent at its arrival time and every streamed chunk is timestamped on arrival; the
chunk gaps are the inter-token latencies a client sees (a chunk carries the text that became stable,
usually one token). `usage` (stream_options.include_usage) gives the exact token counts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from trtpd.bench.client import BenchRequest, RequestResult


async def _one(client, model: str, req: BenchRequest, start_s: float, res: RequestResult, timeout_s: float) -> None:
    import openai

    delay = start_s + req.send_at_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    res.sent_s = time.perf_counter()
    try:
        stream = await client.completions.create(model=model, prompt=req.prompt, max_tokens=req.max_tokens,
                                                 temperature=0, stream=True, stream_options={"include_usage": True},
                                                 timeout=timeout_s)
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].text:
                res.text += chunk.choices[0].text
                res.token_times_s.append(now)
            if chunk.usage is not None:
                res.num_output_tokens = chunk.usage.completion_tokens
    except openai.APIError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.done = True


async def _run(base_url: str, model: str, requests: list[BenchRequest], timeout_s: float,
               on_done: Callable[[RequestResult], None] | None, api_key: str | None) -> list[RequestResult]:
    import httpx
    import openai

    limits = httpx.Limits(max_connections=max(16, len(requests)), max_keepalive_connections=64)
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "none", max_retries=0,
                                http_client=httpx.AsyncClient(limits=limits, timeout=timeout_s))
    results = [RequestResult(r.request_id, r.num_prompt_tokens) for r in requests]
    start = time.perf_counter()

    async def run_one(req: BenchRequest, res: RequestResult) -> None:
        await _one(client, model, req, start, res, timeout_s)
        if on_done is not None:
            on_done(res)
    try:
        await asyncio.gather(*(run_one(q, r) for q, r in zip(requests, results)))
    finally:
        await client.close()
    return results


def run_openai(base_url: str, model: str, requests: list[BenchRequest], timeout_s: float = 300.0,
               on_done: Callable[[RequestResult], None] | None = None,
               api_key: str | None = None) -> list[RequestResult]:
    """Sends `requests` open-loop at their `send_at_s` through the OpenAI API and waits until all finished
    (`Authorization: Bearer api_key` when given)."""
    return asyncio.run(_run(base_url, model, requests, timeout_s, on_done, api_key))
