"""POST /admin/generate: the fleet's Triton entry's way into the gateway (token ids in, NDJSON steps out), with
a scripted orchestrator in place of the fleet (the entry end to end: tests/e2e/test_fleet_entry.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.unit.gateway.test_app import ScriptedService, client, make_config, run
from trtpd.orchestration.orchestrator import OrchestratorError


@pytest.fixture(scope="module")
def folder(tmp_path_factory, fp16_root):
    return fp16_root / "checkpoint"


def post(svc, body, token: str | None = "admin") -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {svc.admin_token if token == 'admin' else token}"}

    async def go():
        async with client(svc) as c:
            return await c.post("/admin/generate", json=body, headers=headers)
    return run(go())


BODY = {"request_id": "entry-1", "prompt_ids": [1, 15043, 29991], "max_new_tokens": 8, "end_id": 2}


def lines(r: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in r.text.splitlines()]


def test_steps_stream_as_lines_then_done_and_the_request_is_sampled_and_counted(folder, tmp_path):
    svc = ScriptedService(make_config(folder, tmp_path))
    r = post(svc, BODY)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson", r.text
    out = lines(r)
    assert out[-1] == {"done": True} and all(len(step["token_ids"]) == 1 for step in out[:-1])
    assert out[0]["perf"] == {"prefill_queue_s": 0.001}          # seconds behind the Triton tensors
    prompt_ids, sampling = svc.orchestrator.calls[0]
    assert prompt_ids == BODY["prompt_ids"] and (sampling.max_new_tokens, sampling.end_id) == (8, 2)
    [sample] = list(svc.samples)
    assert sample.ok and sample.num_tokens == len(out) - 1 and sample.num_prompt_tokens == 3
    counted = {tuple(s.labels.values()): s.value for s in svc.metrics.requests.collect()[0].samples
               if s.name.endswith("_total")}
    assert counted == {("/admin/generate", "200"): 1.0}
    assert svc.admission.num_inflight == 0            # its slot released


@pytest.mark.parametrize("change, field", [
    ({"prompt_ids": [1, -5]}, "prompt_ids.1"), ({"prompt_ids": []}, "prompt_ids"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"request_id": "no spaces"}, "request_id"),
    ({"top_p": 0.0}, "top_p"), ({"max_new_tokens": 500}, "max_new_tokens"), ({"stream": True}, "stream"),
])
def test_a_bad_field_is_a_400_naming_it(folder, tmp_path, change, field):
    svc = ScriptedService(make_config(folder, tmp_path))
    r = post(svc, {**BODY, **change})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert svc.orchestrator.calls == []


def test_only_the_deployments_admin_token_gets_in(folder, tmp_path):
    svc = ScriptedService(make_config(folder, tmp_path, api_keys=frozenset({"user-key"})))
    assert post(svc, BODY, token=None).status_code == 401
    assert post(svc, BODY, token="user-key").status_code == 401     # an API user cannot bypass the OpenAI path
    assert svc.orchestrator.calls == []


def test_refused_or_failed_before_the_first_step_gets_its_status(folder, tmp_path):
    full = ScriptedService(make_config(folder, tmp_path, max_inflight=1, max_queued=0), hold=asyncio.Event())

    async def two_at_once():
        async with client(full) as c:
            headers = {"Authorization": f"Bearer {full.admin_token}"}
            first = asyncio.create_task(c.post("/admin/generate", json=BODY, headers=headers))
            while not full.orchestrator.calls:
                await asyncio.sleep(0.01)
            second = await c.post("/admin/generate", json={**BODY, "request_id": "entry-2"}, headers=headers)
            full.orchestrator.hold.set()
            return second, await first
    second, first = run(two_at_once())
    assert second.status_code == 429 and second.headers["retry-after"] == "1" and first.status_code == 200
    gone = ScriptedService(make_config(folder, tmp_path),
                           fail=OrchestratorError("no decode instance is ready", "unavailable"))
    r = post(gone, BODY)
    assert r.status_code == 503 and "no decode instance" in r.json()["error"]["message"]
    [sample] = list(gone.samples)
    assert sample.error_kind == "unavailable" and not sample.ok


def test_the_samples_answer_is_the_typed_records_and_reads_back(folder, tmp_path):
    """GET /admin/requests gives each RequestSample's fields; the controller reads them back as they were."""
    from trtpd.schema.request_sample import RequestSample

    svc = ScriptedService(make_config(folder, tmp_path))
    assert post(svc, BODY).status_code == 200

    async def go():
        async with client(svc) as c:
            return await c.get("/admin/requests", headers={"Authorization": f"Bearer {svc.admin_token}"})
    answered = run(go()).json()["requests"]
    assert [RequestSample.from_dict(s) for s in answered] == list(svc.samples)
    with pytest.raises(ValueError, match="unknown field"):
        RequestSample.from_dict({**answered[0], "itl_s": 0.1})
