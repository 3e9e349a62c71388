"""Instance failures behind the gateway (2 prefill + 2 decode instances, each its own tritonserver):
SIGKILL a prefill instance with requests in flight, then a decode instance. Requests are prefilled again
elsewhere or end with a clear 5xx, none hangs, the survivors' KV blocks return, new requests succeed."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from trtpd.bench.prompts import prompt_with_tokens
from trtpd.deploy.spec import ReferenceDeployment

from .conftest import fleet_with_gateway, gateway_key, wait_for

pytestmark = pytest.mark.e2e

NUM_REQUESTS = 8
MAX_TOKENS = 48
BOUND_S = 60.0     # no request may take longer than this, whatever fails


@pytest.fixture
def fleet(trtpd_home, fp16_root):
    # a short transfer timeout: a handle abandoned when its decode died is freed by prefill within 5 s
    with fleet_with_gateway("gw-faults", ReferenceDeployment(fp16_root, kv_transport="tcp",
                                                             kv_transfer_timeout_ms=5000), prefill=2, decode=2) as fleet:
        yield fleet


def client(fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{fleet.gateway['port']}/v1", api_key=gateway_key(fleet),
                         max_retries=0, timeout=BOUND_S)


def stream_text(fleet, prompt: str) -> tuple[str, str | None, float]:
    """(text, error or None, seconds)."""
    started = time.monotonic()
    text = ""
    try:
        for chunk in client(fleet).completions.create(model="tiny-llama", prompt=prompt, max_tokens=MAX_TOKENS,
                                                      temperature=0, stream=True):
            text += chunk.choices[0].text if chunk.choices else ""
    except openai.APIError as exc:   # an error event mid-stream, or a 5xx before it
        return text, f"{type(exc).__name__}: {exc}", time.monotonic() - started
    return text, None, time.monotonic() - started


def free_blocks(inst) -> float:
    text = urllib.request.urlopen(inst.metrics_url, timeout=5).read().decode()
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("nv_trt_llm_kv_cache_block_metrics{") and 'kv_cache_block_type="free"' in line)


def load_lines(inst) -> list[str]:
    text = urllib.request.urlopen(inst.metrics_url, timeout=5).read().decode()
    return [line for line in text.splitlines() if line.startswith("nv_trt_llm_request_metrics{")]


def busy(inst) -> bool:
    """The instance holds requests now (waiting or active, from its own metrics)."""
    text = urllib.request.urlopen(inst.metrics_url, timeout=5).read().decode()
    return any(line.startswith("nv_trt_llm_request_metrics{") and ('request_type="active"' in line or
               'request_type="waiting"' in line) and float(line.rsplit(" ", 1)[1]) > 0 for line in text.splitlines())


def run_while_killing(fleet, prompts: list[str], victim) -> list[tuple[str, str | None, float]]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(stream_text, fleet, p) for p in prompts]
        wait_for(lambda: busy(victim), 20.0, f"{victim.name} did not get any of the requests")
        os.kill(victim.server.pid, signal.SIGKILL)
        return [f.result(timeout=BOUND_S + 10) for f in futures]


def test_sigkill_of_a_prefill_instance_then_a_decode_instance(fleet, tokenizer):
    prompts = [prompt_with_tokens(tokenizer, 700 + 13 * i, seed=500 + i) for i in range(NUM_REQUESTS)]
    expected = [client(fleet).completions.create(model="tiny-llama", prompt=p, max_tokens=MAX_TOKENS,
                                                 temperature=0).choices[0].text for p in prompts]
    by_name = {i.name: i for i in fleet.instances}
    baseline = {name: inst.num_kv_blocks for name, inst in by_name.items()}   # all free when idle

    # prefill-0 dies: every request completes (prefilled again on prefill-1) or gets a clear error
    results = run_while_killing(fleet, prompts, by_name["prefill-0"])
    completed = [i for i, (text, err, _) in enumerate(results) if err is None]
    print(f"SIGKILL prefill-0 under {NUM_REQUESTS} streams: {len(completed)} completed, "
          f"{NUM_REQUESTS - len(completed)} errors; slowest {max(r[2] for r in results):.2f} s")
    for i, (text, err, seconds) in enumerate(results):
        assert seconds < BOUND_S
        if err is None:
            assert text == expected[i], i
        else:
            assert "prefill" in err or "instance" in err, err
    assert len(completed) >= NUM_REQUESTS - 2, results   # goal: none; prefilled again elsewhere
    for name in ("prefill-1", "decode-0", "decode-1"):
        wait_for(lambda n=name: free_blocks(by_name[n]) == baseline[n], 20.0,
                 f"{name}'s KV blocks did not return ({free_blocks(by_name[name])} free, baseline {baseline[name]}; "
                 f"{load_lines(by_name[name])})")

    # decode-0 dies: its streams end with an error; new requests go to decode-1 and succeed
    results = run_while_killing(fleet, prompts[:4], by_name["decode-0"])
    errors = [err for _, err, _ in results if err is not None]
    print(f"SIGKILL decode-0 under 4 streams: {4 - len(errors)} completed, {len(errors)} ended with an error; "
          f"slowest {max(r[2] for r in results):.2f} s")
    assert all(seconds < BOUND_S for _, _, seconds in results)
    assert all(text == expected[i] for i, (text, err, _) in enumerate(results) if err is None)
    after = [client(fleet).completions.create(model="tiny-llama", prompt=p, max_tokens=MAX_TOKENS,
                                              temperature=0).choices[0].text for p in prompts[:3]]
    assert after == expected[:3]
    for name in ("prefill-1", "decode-1"):
        wait_for(lambda n=name: free_blocks(by_name[n]) == baseline[n], 20.0, f"{name}'s KV blocks did not return")
