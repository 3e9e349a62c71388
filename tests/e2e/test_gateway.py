"""The OpenAI-compatible gateway in front of a real fleet (each role its own tritonserver), through the
official `openai` client: greedy text equals the single-server ensemble's, usage is right, bad input
gets OpenAI errors, a client that goes away frees its KV, and with 2P+2D every instance serves."""

from __future__ import annotations

import json
import time
import urllib.request

import httpx
import openai
import pytest

from trtpd.bench.prompts import prompt_with_tokens
from trtpd.deploy.spec import ReferenceDeployment

from .conftest import auth, extra_gateway, fleet_with_gateway, gateway_key, wait_for

pytestmark = pytest.mark.e2e

LENGTHS = [1, 2, 3, 17, 31, 32, 33, 64, 100, 200, 257, 400, 511, 640, 800, 1000, 1100, 1300, 1450, 1500]
MAX_TOKENS = 16
EOS = 2


def _fleet_with_gateway(name: str, spec: ReferenceDeployment, **counts):
    with fleet_with_gateway(name, spec, **counts) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def gw_1p1d(trtpd_home, fp16_root):
    yield from _fleet_with_gateway("gw-1p1d", ReferenceDeployment(fp16_root), prefill=1, decode=1)


def client_for(fleet, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{fleet.gateway['port']}/v1", api_key=gateway_key(fleet),
                         max_retries=0, **kw)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    # prompt_with_tokens counts BOS: the gateway tokenizes text the same way the ensemble's preprocessing does
    return {n: "" if n == 1 else prompt_with_tokens(tokenizer, n, seed=100 + n) for n in LENGTHS}   # "": BOS only


def ensemble_text(server, prompt: str, tokenizer=None) -> str:
    """The single server's greedy text: through the ensemble, or, for the empty prompt (BOS only, which the
    ensemble's text entry refuses), through its orchestrator with input_ids."""
    if not prompt:
        import numpy as np

        responses = server.call("disagg_bls", {
            "input_ids": np.array([[1]], dtype=np.int32), "input_lengths": np.array([[1]], dtype=np.int32),
            "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
            "end_id": np.array([[EOS]], dtype=np.int32)})
        ids = [int(t) for r in responses if r.as_numpy("output_ids") is not None
               for t in r.as_numpy("output_ids").reshape(-1)]
        return tokenizer.decode([t for t in ids if t != EOS])
    status, [body] = server.generate({"text_input": prompt, "max_tokens": MAX_TOKENS, "end_id": EOS})
    assert status == 200, body
    return body["text_output"]


def test_greedy_completions_equal_the_single_server_ensemble(gw_1p1d, fp16_disagg, prompts, tokenizer):
    client = client_for(gw_1p1d)
    for n, prompt in prompts.items():
        whole = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        chunks = list(client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True, stream_options={"include_usage": True}))
        expected = ensemble_text(fp16_disagg, prompt, tokenizer)
        assert whole.choices[0].text == expected, n
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected, n
        assert whole.usage.prompt_tokens == len(tokenizer.encode(prompt)) == n
        assert 1 <= whole.usage.completion_tokens <= MAX_TOKENS
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        assert whole.choices[0].finish_reason == ("length" if whole.usage.completion_tokens == MAX_TOKENS else "stop")


def test_chat_completion_and_models(gw_1p1d):
    client = client_for(gw_1p1d)
    assert [m.id for m in client.models.list().data] == ["tiny-llama"]
    reply = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "Hello!"}],
                                           max_tokens=8, temperature=0)
    assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens <= 8
    stream = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "Hello!"}],
                                            max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == reply.choices[0].message.content


@pytest.mark.parametrize("kwargs, status, fragment", [
    ({"model": "nope", "prompt": "x"}, 404, "does not exist"),
    ({"model": "tiny-llama", "prompt": "x", "n": 2}, 400, "n=2 is not supported"),
    ({"model": "tiny-llama", "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ({"model": "tiny-llama", "prompt": "word " * 3000}, 400, "over this model's limit"),
])
def test_bad_input_gets_an_openai_error_and_the_gateway_keeps_serving(gw_1p1d, kwargs, status, fragment):
    client = client_for(gw_1p1d)
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(**kwargs)
    assert err.value.status_code == status and fragment in err.value.message
    assert client.completions.create(model="tiny-llama", prompt="still here", max_tokens=2).usage.completion_tokens


def _instance_blocks(fleet) -> dict[str, float]:
    out = {}
    for inst in fleet.instances:
        text = urllib.request.urlopen(inst.metrics_url, timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith("nv_trt_llm_kv_cache_block_metrics{") and 'kv_cache_block_type="free"' in line:
                out[inst.name] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_client_that_goes_away_mid_stream_frees_its_kv_at_once(gw_1p1d, prompts):
    baseline = {i.name: float(i.num_kv_blocks) for i in gw_1p1d.instances}   # idle: every block free
    wait_for(lambda: _instance_blocks(gw_1p1d) == baseline, 20.0, "the fleet was not idle before the test")
    url = f"http://127.0.0.1:{gw_1p1d.gateway['port']}/v1/completions"
    body = {"model": "tiny-llama", "prompt": prompts[511], "max_tokens": 1000, "temperature": 0, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=60, headers=auth(gw_1p1d)) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]      # a few tokens in, then hang up
    assert any(g.startswith("data:") for g in got)
    # decode's blocks return long before 1,000 tokens could have been generated (and prefill's once pulled)
    wait_for(lambda: _instance_blocks(gw_1p1d) == baseline, 10.0, "KV blocks did not return to baseline")


@pytest.fixture(scope="module")
def gw_2p2d(trtpd_home, fp16_root):
    yield from _fleet_with_gateway("gw-2p2d", ReferenceDeployment(fp16_root), prefill=2, decode=2)


def test_2p2d_every_instance_serves_and_their_metrics_differ(gw_2p2d, fp16_disagg, prompts):
    client = client_for(gw_2p2d)
    for i in range(12):
        n = [17, 100, 257][i % 3]
        reply = client.completions.create(model="tiny-llama", prompt=prompts[n], max_tokens=MAX_TOKENS, temperature=0)
        assert reply.choices[0].text == ensemble_text(fp16_disagg, prompts[n]), n   # whichever instances served
    served = {}
    for inst in gw_2p2d.instances:
        text = urllib.request.urlopen(inst.metrics_url, timeout=5).read().decode()
        lines = [line for line in text.splitlines() if line.startswith("nv_trt_llm_request_metrics{")
                 and 'request_type="completed"' in line]
        assert lines and f'instance="{inst.name}"' in lines[0], lines
        served[inst.name] = float(lines[0].rsplit(" ", 1)[1])
    assert all(count > 0 for count in served.values()), served
    health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{gw_2p2d.gateway['port']}/health").read())
    assert health["status"] == "ok" and sorted(i["name"] for i in health["instances"]) == sorted(served)
    metrics = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{gw_2p2d.gateway['port']}/metrics",
                                                            headers=auth(gw_2p2d))).read().decode()
    assert "trtpd_gateway_ttft_seconds_count 12.0" in metrics
    assert 'trtpd_gateway_ttft_breakdown_seconds_count{phase="prefill_compute"}' in metrics


def test_a_burst_over_capacity_gets_429s_not_timeouts_and_the_gateway_recovers(gw_1p1d, prompts):
    """A second gateway on the same fleet with room for 2 in flight and 2 queued: of 12 requests sent at
    once, the ones beyond that are refused at once with 429; afterwards it serves again."""
    from concurrent.futures import ThreadPoolExecutor

    with extra_gateway(gw_1p1d, gw_1p1d.folder / "gateway-small", "--max-inflight", "2", "--max-queued", "2") \
            as (port, _):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=gateway_key(gw_1p1d), max_retries=0)

        def one(i):
            started = time.monotonic()
            try:
                client.completions.create(model="tiny-llama", prompt=prompts[640], max_tokens=32, temperature=0)
                return 200, time.monotonic() - started
            except openai.APIStatusError as exc:
                return exc.status_code, time.monotonic() - started
        with ThreadPoolExecutor(12) as pool:
            results = list(pool.map(one, range(12)))
        codes = sorted(code for code, _ in results)
        print(f"burst of 12 on max_inflight 2 + max_queued 2: {codes}")
        assert codes == [200] * 4 + [429] * 8     # exact bounds: 2 served + 2 queued, the rest refused
        assert all(seconds < 5.0 for code, seconds in results if code == 429)    # refused at once, not timed out
        assert client.completions.create(model="tiny-llama", prompt="again", max_tokens=2).usage.completion_tokens


def test_a_draining_instance_gets_no_new_request_and_serves_again_when_ready(gw_2p2d, prompts):
    from trtpd.kv.auth import gateway_admin_token
    from trtpd.kv.handle import load_or_create_key_file

    base = f"http://127.0.0.1:{gw_2p2d.gateway['port']}"
    token = gateway_admin_token(load_or_create_key_file(gw_2p2d.key_file))

    def put_state(name: str, state: str, auth: str = token) -> httpx.Response:
        return httpx.put(f"{base}/admin/instances/{name}", json={"state": state},
                         headers={"Authorization": f"Bearer {auth}"}, timeout=10)

    def completed() -> dict[str, float]:
        out = {}
        for inst in gw_2p2d.instances:
            text = urllib.request.urlopen(inst.metrics_url, timeout=5).read().decode()
            out[inst.name] = next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                  if line.startswith("nv_trt_llm_request_metrics{")
                                  and 'request_type="completed"' in line)
        return out

    assert put_state("prefill-1", "draining", auth="wrong").status_code == 401
    assert put_state("nope", "draining").status_code == 404
    answer = put_state("prefill-1", "draining")
    assert answer.status_code == 200 and answer.json()["state"] == "draining"
    before = completed()
    client = client_for(gw_2p2d)
    for i in range(6):
        client.completions.create(model="tiny-llama", prompt=prompts[[17, 100][i % 2]], max_tokens=2)
    wait_for(lambda: completed()["prefill-0"] == before["prefill-0"] + 6, 10.0, "prefill-0 did not serve all 6")
    assert completed()["prefill-1"] == before["prefill-1"]           # drained: nothing new
    assert put_state("prefill-1", "ready").json()["state"] == "ready"
    for i in range(4):
        client.completions.create(model="tiny-llama", prompt=prompts[17], max_tokens=2)
    wait_for(lambda: completed()["prefill-1"] > before["prefill-1"], 10.0, "prefill-1 did not serve again")
