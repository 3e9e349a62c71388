"""The gateway's HTTP layer with a scripted orchestrator in place of the fleet (the fleet itself is
tested end to end in tests/e2e/test_gateway.py): OpenAI bodies, errors and their status, limits."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from trtpd.engine.tokenizer import Tokenizer
from trtpd.gateway.app import create_app
from trtpd.gateway.config import GatewayConfig
from trtpd.orchestration.orchestrator import OrchestratorError, Generated
from trtpd.gateway.service import FleetService


class ScriptedOrchestrator:
    """Yields the tokens of `text` one by one, or fails as told; a text shorter than max_tokens ends the stream
    early without a token, as TensorRT-LLM ends a sequence at its end id (it never outputs the end id)."""

    def __init__(self, tokenizer, text: str, fail: OrchestratorError | None = None, hold: asyncio.Event | None = None):
        self.ids = tokenizer.encode(text, add_bos=False)
        self.fail = fail
        self.hold = hold
        self.calls = []

    async def generate(self, request_id, prompt_ids, sampling, exclude=frozenset()):
        self.calls.append((prompt_ids, sampling))
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        for i, token in enumerate(self.ids[:sampling.max_new_tokens]):
            yield Generated([token], {"prefill_queue_s": 0.001} if i == 0 else {})


class ScriptedService(FleetService):
    def __init__(self, config, orchestrator_text="Hello world, hello there", **kw):
        super().__init__(config)
        self.orchestrator = ScriptedOrchestrator(self.tokenizer, orchestrator_text, **kw)

    async def start(self):
        pass

    async def stop(self):
        pass


@pytest.fixture(scope="module")
def folder(tmp_path_factory, fp16_root) -> Path:
    return fp16_root / "checkpoint"


def make_config(folder: Path, tmp_path: Path, **kw) -> GatewayConfig:
    key = tmp_path / "kv.key"   # generated (0600) on first use
    return GatewayConfig(model_name="tiny-llama", mode="disaggregated", instances=(), key_file=key,
                         tokenizer_dir=folder, max_input_len=64, max_seq_len=96, **kw)


def client(service) -> httpx.AsyncClient:
    app = create_app(service.config, service)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")


def run(coro):
    return asyncio.run(coro)


def test_completion_whole_with_usage_and_stop_at_eos(folder, tmp_path):
    svc = ScriptedService(make_config(folder, tmp_path))

    async def go():
        async with client(svc) as c:
            r = await c.post("/v1/completions", json={"model": "tiny-llama", "prompt": "Hi", "max_tokens": 40,
                                                        "temperature": 0})
            return r
    r = run(go())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "Hello world, hello there"
    assert body["choices"][0]["finish_reason"] == "stop"
    tok = Tokenizer.load(folder / "tokenizer.json")
    n, p = len(tok.encode("Hello world, hello there", add_bos=False)), len(tok.encode("Hi"))
    assert body["usage"] == {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}   # no EOS token
    prompt_ids, sampling = svc.orchestrator.calls[0]
    assert prompt_ids == tok.encode("Hi") and sampling.temperature == 0 and sampling.max_new_tokens == 40


class EndedInPrefill(ScriptedOrchestrator):
    """The request ended at its first token in prefill (its end id): one final step with no token and no decode
    instance (the orchestrator's answer then, tests/unit/orchestration/test_context_end.py)."""

    async def generate(self, request_id, prompt_ids, sampling, exclude=frozenset()):
        self.calls.append((prompt_ids, sampling))
        yield Generated([], {"prefill_compute_s": 0.001}, "prefill-0", None)


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_that_ended_at_its_first_token_is_an_empty_stop_completion(folder, tmp_path, stream):
    svc = ScriptedService(make_config(folder, tmp_path))
    svc.orchestrator = EndedInPrefill(svc.tokenizer, "")
    body = {"model": "tiny-llama", "prompt": "Hi", "max_tokens": 8, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}

    async def go():
        async with client(svc) as c:
            r = await c.post("/v1/completions", json=body)
            return r.status_code, r.text
    status, text = run(go())
    assert status == 200, text
    if stream:
        events = [json.loads(line[5:]) for line in text.splitlines()
                  if line.startswith("data:") and "[DONE]" not in line]
        choices = [e["choices"][0] for e in events if e["choices"]]
        assert "".join(c["text"] for c in choices) == "" and choices[-1]["finish_reason"] == "stop"
        usage = events[-1]["usage"]
    else:
        (choice,) = json.loads(text)["choices"]
        assert (choice["text"], choice["finish_reason"]) == ("", "stop")
        usage = json.loads(text)["usage"]
    assert usage["completion_tokens"] == 0


def test_chat_streaming_chunks_then_usage_then_done(folder, tmp_path):
    svc = ScriptedService(make_config(folder, tmp_path))

    async def go():
        async with client(svc) as c:
            async with c.stream("POST", "/v1/chat/completions", json={
                    "model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "stream": True,
                    "stream_options": {"include_usage": True}}) as r:
                return r.status_code, [line async for line in r.aiter_lines() if line.startswith("data:")]
    status, lines = run(go())
    assert status == 200 and lines[-1] == "data: [DONE]"
    events = [json.loads(line[5:]) for line in lines[:-1]]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == \
        "Hello world, hello there"
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-1]["usage"]["prompt_tokens"] > 0


def test_a_stop_string_cuts_the_text_and_ends_the_request(folder, tmp_path):
    svc = ScriptedService(make_config(folder, tmp_path))

    async def go():
        async with client(svc) as c:
            return await c.post("/v1/completions", json={"model": "tiny-llama", "prompt": "Hi", "max_tokens": 40,
                                                           "stop": [", hello"]})
    body = run(go()).json()
    assert body["choices"][0]["text"] == "Hello world" and body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("payload, status, param, fragment", [
    (b"{not json", 400, None, "not valid JSON"),
    ({"model": "tiny-llama", "prompt": "x", "temprature": 0.5}, 400, "temprature", "Extra inputs"),
    ({"model": "tiny-llama", "prompt": "x", "max_tokens": -3}, 400, "max_tokens", "greater than or equal to 1"),
    ({"model": "tiny-llama", "prompt": "x", "max_tokens": "many"}, 400, "max_tokens", "valid integer"),
    ({"model": "tiny-llama", "prompt": "x", "n": 2}, 400, "n", "n=2 is not supported"),
    ({"model": "tiny-llama", "prompt": "x", "best_of": 0}, 400, "best_of", "best_of=0 is not supported"),
    ({"model": "tiny-llama", "prompt": "x", "top_p": 1e-50}, 400, "top_p", "rounds to 0 in float32"),
    (b'{"model": "tiny-llama", "prompt": "a\\ud800b"}', 400, "prompt", "lone surrogate"),
    ({"model": "tiny-llama", "prompt": ["a", "b"]}, 400, "prompt", "one prompt per request"),
    ({"model": "tiny-llama", "prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options",
     "only allowed with stream=true"),
    (b'{"model": "tiny-llama", "prompt": "x", "seed": 1' + b"0" * 5000 + b"}", 400, None, "not valid JSON"),
    (b'{"model": "tiny-llama", "prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, None, "too deeply"),
    ({"model": "tiny-llama", "prompt": "x" * 5000}, 400, "prompt", "more than 64 tokens"),
    ({"model": "tiny-llama", "prompt": "x", "temperature": 9}, 400, "temperature", "less than or equal to 2"),
    ({"model": "gpt-9", "prompt": "x"}, 404, "model", "does not exist"),
    ({"model": "tiny-llama", "prompt": "word " * 80}, 400, "prompt", "over this model's limit of 64"),
    ({"model": "tiny-llama", "prompt": "x", "max_tokens": 95}, 400, "max_tokens", "ask for at most 9"),
])
def test_bad_requests_get_openai_errors_naming_the_field(folder, tmp_path, payload, status, param, fragment):
    svc = ScriptedService(make_config(folder, tmp_path))

    async def go():
        async with client(svc) as c:
            if isinstance(payload, bytes):
                return await c.post("/v1/completions", content=payload, headers={"content-type": "application/json"})
            return await c.post("/v1/completions", json=payload)
    r = run(go())
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert fragment in error["message"] and error["param"] == param
    assert error["type"] == "invalid_request_error" and not svc.orchestrator.calls


def test_api_key_required_when_configured(folder, tmp_path):
    svc = ScriptedService(make_config(folder, tmp_path, api_keys=frozenset({"sk-right"})))

    async def go():
        async with client(svc) as c:
            body = {"model": "tiny-llama", "prompt": "x"}
            return [(await c.post("/v1/completions", json=body, headers=h)).status_code
                    for h in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Bearer sk-right"})]
    assert run(go()) == [401, 401, 200]


def test_a_body_over_the_limit_is_refused_with_413(folder, tmp_path):
    svc = ScriptedService(make_config(folder, tmp_path, max_body_bytes=100))

    async def go():
        async with client(svc) as c:
            return await c.post("/v1/completions", json={"model": "tiny-llama", "prompt": "x" * 200})
    assert run(go()).status_code == 413


def test_server_faults_are_5xx_and_the_queue_answers_429_when_full(folder, tmp_path):
    hold = asyncio.Event()
    svc = ScriptedService(make_config(folder, tmp_path, max_inflight=1, max_queued=1), hold=hold,
                          fail=OrchestratorError("no decode instance is ready", "unavailable"))

    async def go():
        async with client(svc) as c:
            body = {"model": "tiny-llama", "prompt": "x"}
            first = asyncio.create_task(c.post("/v1/completions", json=body))
            second = asyncio.create_task(c.post("/v1/completions", json=body))
            while svc.admission.num_queued < 1 or svc.admission.num_inflight < 1:
                await asyncio.sleep(0.01)
            third = await c.post("/v1/completions", json=body)
            hold.set()
            return third, await first, await second
    third, first, second = run(go())
    assert third.status_code == 429 and third.json()["error"]["type"] == "rate_limit_error"
    assert first.status_code == 503 and second.status_code == 503
    assert "no decode instance is ready" in first.json()["error"]["message"]
    assert third.headers["retry-after"] == "1" and first.headers["retry-after"] == "1"
    assert svc.admission.num_queued == 0 and svc.admission.num_inflight == 0    # every slot came back


@pytest.mark.parametrize("ignore_eos, want_end_id", [(False, 2), (True, -1)])
def test_ignore_eos_sends_no_end_id_so_the_instance_generates_max_tokens(folder, tmp_path, ignore_eos, want_end_id):
    svc = ScriptedService(make_config(folder, tmp_path))

    async def go():
        async with client(svc) as c:
            return await c.post("/v1/completions", json={"model": "tiny-llama", "prompt": "Hi", "max_tokens": 3,
                                                           "ignore_eos": ignore_eos})
    r = run(go())
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3 and r.json()["choices"][0]["finish_reason"] == "length"
    assert svc.orchestrator.calls[0][1].end_id == want_end_id == (-1 if ignore_eos else svc.config.eos_id)
