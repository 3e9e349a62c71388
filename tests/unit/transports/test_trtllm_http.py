"""trtllm-serve's protocol as trtpd speaks it: the request bodies, the handle, errors and loads. Pure parts."""

from __future__ import annotations

import asyncio
import json

import pytest

from trtpd.orchestration.transport import RoleError, SamplingInputs
from trtpd.schema.trtllm_serve import (DisaggregatedParams, ProtocolError, WorkerInfo, encode_opaque_state,
                                       error_message, workers_prefix)
from trtpd.transports.trtllm_http import (ServeClient, context_handle, opaque_state, read_handle, request_body,
                                          view_from_stats)


def test_bodies_ask_for_token_ids_and_send_only_what_differs_from_the_defaults():
    body = request_body("m", [1, 2], SamplingInputs(max_new_tokens=5, end_id=2), False,
                        DisaggregatedParams("context_only"))
    assert body == {"model": "m", "prompt": [1, 2], "max_tokens": 5, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                    "stream": False, "detokenize": False, "disaggregated_params": {"request_type": "context_only"}}
    body = request_body("m", [1], SamplingInputs(max_new_tokens=1, end_id=-1, seed=7), True, None)
    assert body["ignore_eos"] is True and body["seed"] == 7 and "disaggregated_params" not in body


def test_a_context_answer_round_trips_as_the_handle_and_goes_on_as_generation_only():
    params = DisaggregatedParams("context_only", [42], 17, encode_opaque_state(b"TPDH-signed"), None)
    handle = context_handle({"disaggregated_params": params.to_dict(), "finish_reason": "not_finished",
                             "token_ids": [42]})
    back, finish, tokens = read_handle(handle, "prefill-0")
    assert (back, finish, tokens) == (params, "not_finished", [42])
    assert back.for_generation() == DisaggregatedParams("generation_only", [42], 17, params.encoded_opaque_state)
    assert opaque_state(handle) == b"TPDH-signed"
    with pytest.raises(RoleError, match="not a context answer"):
        read_handle(b"{}", "prefill-0")


def test_disaggregated_params_are_checked_field_by_field():
    with pytest.raises(ProtocolError, match=r"disaggregated_params\.ctx_id: extra inputs"):
        DisaggregatedParams.from_dict({"request_type": "context_only", "ctx_id": 1})
    with pytest.raises(ProtocolError, match="request_type must be one of"):
        DisaggregatedParams.from_dict({"request_type": "prefill"})
    with pytest.raises(ProtocolError, match="first_gen_tokens must be a list"):
        DisaggregatedParams.from_dict({"request_type": "generation_only", "first_gen_tokens": ["a"]})
    with pytest.raises(ProtocolError, match="not valid base64"):
        DisaggregatedParams("generation_only", encoded_opaque_state="%%%").opaque_state()
    assert DisaggregatedParams.from_dict({"request_type": "CONTEXT_ONLY"}).request_type == "context_only"


def test_an_error_message_is_read_from_each_shape_upstream_answers_in():
    assert error_message(400, b'{"object":"error","message":"bad","type":"BadRequestError","code":400}') == "bad"
    assert error_message(400, b'{"error":"1 validation error"}') == "1 validation error"
    assert error_message(500, b'{"detail":"Internal server error x"}') == "Internal server error x"
    assert error_message(502, b"<html>") .startswith("HTTP 502")


@pytest.mark.parametrize("status, kind", [(400, "internal"), (403, "internal"), (500, "unavailable"),
                                          (503, "unavailable"), (404, "unavailable")])
def test_a_worker_answer_maps_to_the_routing_cores_kind(status, kind):
    """trtllm-serve answers 400 for every failed request (a KV transfer as much as a field the gateway validated):
    a server fault, retried elsewhere; a 5xx is the worker unavailable."""
    client = ServeClient("decode-0", "127.0.0.1:9", "m", None)
    with pytest.raises(RoleError) as info:
        client._check(status, json.dumps({"message": "x"}).encode())
    assert info.value.kind == kind and info.value.instance == "decode-0"
    asyncio.run(client.close())


# A context answer of trtllm-serve's PyTorch path for a request that ended at its first token: TorchSampler finished
# it (END_ID, or STOP_WORDS), py_executor sent no KV (_send_disagg_ctx_cache: only context-finished or length-finished
# requests), and executor/result.py leaves the request's own disaggregated_params (no ctx_request_id, first tokens or
# opaque state); finish_reason "stop". Whether its token_ids hold the end id is not verified: both are read.
def _ended_answer(token_ids: list[int]) -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "model": "m", "prompt_token_ids": [1, 2],
            "choices": [{"index": 0, "text": "", "token_ids": token_ids, "finish_reason": "stop", "stop_reason": None,
                         "disaggregated_params": {"request_type": "context_only", "first_gen_tokens": None,
                                                  "ctx_request_id": None, "encoded_opaque_state": None,
                                                  "draft_tokens": None}}]}


@pytest.mark.parametrize("token_ids, answer", [([], []), ([2], []), ([9], [9])],
                         ids=["no end id", "the end id", "a stop word"])
def test_a_context_answer_that_ended_the_request_is_the_whole_answer(token_ids, answer):
    """_need_gen: a context answer whose finish_reason is neither length nor not_finished ended the request. The hop
    says so (ended, no handle: nothing was exported), needs no ctx_request_id, and never passes the end id on."""
    import httpx
    client = ServeClient("prefill-0", "127.0.0.1:9", "m", None)
    client.client = httpx.AsyncClient(base_url=client.url, transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json=_ended_answer(token_ids))))

    async def run():
        try:
            return [c async for c in client.stream("r-p1", "context_only", [1, 2], SamplingInputs(4, end_id=2))]
        finally:
            await client.close()
    (chunk,) = asyncio.run(run())
    assert (chunk.token_ids, chunk.handle, chunk.final, chunk.ended) == (answer, None, True, True)


def test_the_orchestrator_ends_such_a_request_without_a_generation_worker():
    """Over the HTTP transport end to end: the context worker's "stop" answer is the client's (no end id, no
    tokens), and the generation worker is never picked or sent anything."""
    import httpx
    from trtpd.orchestration.orchestrator import Orchestrator
    from trtpd.routing.core import InstanceView, Router, RoutingPolicy
    asked: list[str] = []
    prefill = ServeClient("prefill-0", "127.0.0.1:9", "m", None)
    prefill.client = httpx.AsyncClient(base_url=prefill.url, transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json=_ended_answer([2]))))
    decode = ServeClient("decode-0", "127.0.0.1:9", "m", None)
    decode.client = httpx.AsyncClient(base_url=decode.url, transport=httpx.MockTransport(
        lambda request: asked.append(request.url.path) or httpx.Response(500)))
    router = Router(RoutingPolicy())
    router.update([InstanceView("prefill-0", "prefill"), InstanceView("decode-0", "decode")], 0.0)
    given_up: list = []
    orch = Orchestrator("disaggregated", router, {"prefill-0": prefill, "decode-0": decode},
                        give_up=lambda *args: given_up.append(args))

    async def run():
        try:
            return [g async for g in orch.generate("r", [1, 2], SamplingInputs(max_new_tokens=4, end_id=2))]
        finally:
            await prefill.close()
            await decode.close()
    steps = asyncio.run(run())
    assert [(s.token_ids, s.decode_instance) for s in steps] == [([], None)]
    assert asked == [] and given_up == [] and router.num_tracked_requests == 0


def test_what_trtllm_serve_cannot_carry_is_refused_as_the_clients():
    client = ServeClient("prefill-0", "127.0.0.1:9", "m", None)

    async def run(sampling):
        try:
            return [c async for c in client.stream("r", "context_only", [1], sampling)]
        finally:
            await client.close()
    with pytest.raises(RoleError, match="not Triton tensors") as info:
        asyncio.run(run(SamplingInputs(2, triton_inputs={"stop_words_list": [[1]]})))
    assert info.value.kind == "invalid_arg"


def test_an_unreachable_worker_is_unavailable_and_a_transport_failure():
    client = ServeClient("prefill-0", "127.0.0.1:9", "m", None)

    async def run():
        try:
            return [c async for c in client.stream("r", "context_only", [1], SamplingInputs(2))]
        finally:
            await client.close()
    with pytest.raises(RoleError) as info:
        asyncio.run(run())
    assert info.value.kind == "unavailable" and info.value.transport


def test_iteration_stats_become_the_routing_view():
    stats = {"numQueuedRequests": 3, "numActiveRequests": 2, "maxNumActiveRequests": 8,
             "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 60, "tokensPerBlock": 64},
             "inflightBatchingStats": {"numPausedRequests": 1}}
    view = view_from_stats("decode-0", "decode", stats)
    assert (view.waiting, view.active, view.free_kv_blocks, view.max_kv_blocks, view.max_batch_size,
            view.tokens_per_block, view.state) == (4, 2, 60, 100, 8, 64, "ready")


def test_worker_registrations_round_trip():
    info = WorkerInfo("CONTEXT-localhost:8001-1-2-003", "localhost", 8001, 0)
    assert WorkerInfo.from_json(info.to_json()) == info and info.url == "http://localhost:8001"
    assert workers_prefix("") == "/trtllm-disagg//workers"
    with pytest.raises(ProtocolError, match="role 7"):
        WorkerInfo.from_json(json.dumps({"worker_id": "x", "host": "h", "port": 1, "role": 7}))


def _probing(answers: list) -> ServeClient:
    """A client whose worker answers /metrics with `answers` in turn (an in-process transport: the probe's logic)."""
    import httpx
    client = ServeClient("decode-0", "127.0.0.1:9", "m", None)
    replies = iter(answers)

    def handler(request):
        answer = next(replies)
        return httpx.Response(500) if answer is None else httpx.Response(200, json=answer)
    client.client = httpx.AsyncClient(base_url=client.url, transport=httpx.MockTransport(handler))
    return client


def test_the_probe_reads_the_latest_stats_and_knows_an_idle_or_new_worker():
    """A worker with no iteration yet is empty (unbounded free KV, so it is picked); an empty read after stats
    means idle (a generation worker's KV all free again); no answer is unhealthy."""
    stats = {"numQueuedRequests": 1, "numActiveRequests": 3, "maxNumActiveRequests": 8,
             "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 40, "tokensPerBlock": 32}}
    client = _probing([[], [{"numActiveRequests": 9}, stats], [], None])

    async def run():
        try:
            return [await client.probe("decode") for _ in range(4)]
        finally:
            await client.close()
    new, busy, idle, gone = asyncio.run(run())
    assert new.state == "ready" and new.free_kv_blocks > 1_000_000 and new.max_kv_blocks == 0
    assert (busy.active, busy.waiting, busy.free_kv_blocks) == (3, 1, 40)
    assert (idle.active, idle.waiting, idle.free_kv_blocks, idle.max_kv_blocks) == (0, 0, 100, 100)
    assert gone.state == "unhealthy"


# ---- /perf_metrics: the TTFT breakdown over trtllm-serve ---------------------------------------------------------
def _record(request_id: int, ctx_request_id, t: "RequestTimings", offset_s: float = 0.0) -> dict:
    from trtpd.schema.trtllm_serve import perf_record
    return perf_record(request_id, ctx_request_id, t, 3, 9, offset_s, server_arrival_time=t.arrival_time)


def test_perf_records_are_upstreams_shape_and_become_the_ttft_phases():
    """A record as openai_server.py get_perf_metrics writes it (kv_cache_* only when KV moved, every time shifted by
    the router's clock offset) reads back, and a context server's becomes prefill queue + compute, a generation
    server's decode queue (until the transfer started) + transfer + bytes."""
    from trtpd.schema.trtllm_serve import (RequestTimings, context_phase_perf, generation_phase_perf,
                                           read_perf_record)
    ctx = RequestTimings(10.0, 10.25, 10.75, 10.75)
    record = _record(1, 17, ctx, offset_s=100.0)
    timing = record["perf_metrics"]["timing_metrics"]
    assert record["ctx_request_id"] == 17 and record["perf_metrics"]["first_iter"] == 3
    assert set(timing) == {"server_arrival_time", "arrival_time", "first_scheduled_time", "first_token_time",
                           "server_first_token_time", "last_token_time"}
    assert timing["arrival_time"] == 110.0 and timing["server_first_token_time"] is None
    ctx_id, back = read_perf_record(record)
    assert ctx_id == 17 and back == RequestTimings(110.0, 110.25, 110.75, 110.75)
    assert context_phase_perf(back) == {"prefill_queue_s": 0.25, "prefill_compute_s": 0.5}

    gen = RequestTimings(20.0, 20.5, 21.5, 23.0, 4096, 20.5, 21.25)
    timing = _record(2, 17, gen)["perf_metrics"]["timing_metrics"]
    assert (timing["kv_cache_size"], timing["kv_cache_transfer_start"], timing["kv_cache_transfer_end"]) == \
        (4096, 20.5, 21.25)
    assert generation_phase_perf(read_perf_record(_record(2, 17, gen))[1]) == {
        "decode_queue_s": 0.5, "kv_transfer_s": 0.75, "kv_transfer_bytes": 4096.0}
    # no KV moved: queued until first scheduled, no transfer reported
    assert generation_phase_perf(RequestTimings(1.0, 1.5, 2.0, 2.0)) == {"decode_queue_s": 0.5}
    assert read_perf_record(_record(3, None, ctx)) is None          # not disaggregated: nothing to match
    assert read_perf_record({"request_id": 1}) is None


def test_a_finished_sub_requests_timings_come_from_one_shared_read_of_perf_metrics():
    """Four sub-requests of one generation worker finish at once: one read of /perf_metrics (which hands out every
    record once) serves them all, the others waiting for it rather than reading again; one the worker has no
    record of gets {}; two context workers' equal ctx_request_ids are kept apart (oldest first); a later ask whose
    record is not kept reads again."""
    import httpx
    from trtpd.schema.trtllm_serve import RequestTimings
    client = ServeClient("decode-0", "127.0.0.1:9", "m", None)
    reads = []
    answers = iter([[_record(1, 5, RequestTimings(0.0, 0.5, 1.0, 2.0, 100, 0.5, 0.75)),
                     _record(2, 6, RequestTimings(0.0, 0.25, 1.0, 2.0, 200, 0.25, 0.5)),
                     _record(3, 6, RequestTimings(0.0, 0.0, 1.0, 2.0, 300, 0.0, 1.0))], []])
    asked = ("r1-d1", "r2-d1", "r3-d1", "r4-d1", "never")

    def handler(request):
        reads.append(request.url.path)
        return httpx.Response(200, json=next(answers))
    client.client = httpx.AsyncClient(base_url=client.url, transport=httpx.MockTransport(handler))
    client._await_perf("r1-d1", 5, "generation_only")
    client._await_perf("r2-d1", 6, "generation_only")
    client._await_perf("r3-d1", 6, "generation_only")
    client._await_perf("r4-d1", 8, "generation_only")

    async def run():
        try:
            together = await asyncio.gather(*(client.request_perf(r) for r in asked))
            client._await_perf("r5-d1", 9, "generation_only")
            return together, await client.request_perf("r5-d1")
        finally:
            await client.close()
    (first, second, third, missing, unknown), later = asyncio.run(run())
    assert first == {"decode_queue_s": 0.5, "kv_transfer_s": 0.25, "kv_transfer_bytes": 100.0}
    assert second["kv_transfer_bytes"] == 200.0 and third["kv_transfer_bytes"] == 300.0
    assert missing == {} and unknown == {} and later == {}
    assert reads == ["/perf_metrics", "/perf_metrics"]


def test_a_worker_without_perf_metrics_or_not_answering_gives_no_timings():
    import httpx
    for reply in (httpx.Response(200, json=[]), httpx.Response(500), httpx.Response(200, text="not json")):
        client = ServeClient("prefill-0", "127.0.0.1:9", "m", None)
        client.client = httpx.AsyncClient(base_url=client.url, transport=httpx.MockTransport(lambda _: reply))
        client._await_perf("r-p1", 1, "context_only")

        async def run():
            try:
                return await client.request_perf("r-p1")
            finally:
                await client.close()
        assert asyncio.run(run()) == {}
