"""The orchestrator gives up a prefill's KV handle whenever no decode will pull it (the request failed, moved on or
its client left before the decode streamed), and never one a decode pulled. The exporter's side of it, against a
real prefill process, is tests/integration/kv/test_kv_give_up.py."""

from __future__ import annotations

import asyncio

import pytest

from trtpd.orchestration.orchestrator import Orchestrator, OrchestratorError
from trtpd.orchestration.transport import RoleChunk, RoleError, SamplingInputs
from trtpd.routing.core import InstanceView, Router, RoutingPolicy


class _Client:
    """Prefill: a handle named after the sub-request. Decode: `decode` says what it does with each request."""

    def __init__(self, name: str, decode: str = "serve", failures: list | None = None, prefill: str = "serve") -> None:
        self.name, self.decode, self.prefill = name, decode, prefill
        self.failures = failures if failures is not None else []   # "fail once": shared by the decode instances
        self.started = asyncio.Event()

    async def stream(self, request_id, request_type, ids, sampling, handle=None):
        if request_type == "context_only":
            self.started.set()
            if self.prefill == "hang":      # its answer (the handle) never reaches the orchestrator
                await asyncio.sleep(3600)
            if self.prefill == "fail":
                raise RoleError("prefill refused it", "invalid_arg", self.name)
            yield RoleChunk([], handle=f"kv-of-{request_id}".encode(), final=True)
            return
        self.started.set()
        if self.decode == "fail once" and not self.failures:
            self.failures.append(self.name)
            raise RoleError("decode-0 broke before its first token", "internal", self.name)
        if self.decode == "hang":
            await asyncio.sleep(3600)
        yield RoleChunk([7], final=True)


def _orchestrator(decode: str = "serve", with_decode: bool = True, wait_s: float = 0.0,
                  policy: RoutingPolicy | None = None, num_decode: int = 1, prefill: str = "serve"):
    router = Router(policy or RoutingPolicy())
    decodes = [f"decode-{i}" for i in range(num_decode if with_decode else 0)]
    router.update([InstanceView("prefill-0", "prefill")] + [InstanceView(d, "decode") for d in decodes], 0.0)
    given_up: list = []
    failures: list[str] = []
    clients = {"prefill-0": _Client("prefill-0", prefill=prefill), **{d: _Client(d, decode, failures) for d in decodes}}

    def give_up(instance, sub_id, handle):
        given_up.append(handle if handle is not None else (instance, sub_id))
    orch = Orchestrator("disaggregated", router, clients, wait_for_instance_s=wait_s, give_up=give_up)
    return orch, clients, given_up


async def _all(orch, request_id="r"):
    return [g async for g in orch.generate(request_id, [1, 2, 3], SamplingInputs(max_new_tokens=1))]


def test_a_pulled_handle_is_not_given_up():
    orch, _, given_up = _orchestrator()
    assert [g.token_ids for g in asyncio.run(_all(orch))] == [[7]]
    assert given_up == []


def test_a_handle_no_decode_can_take_is_given_up():
    orch, _, given_up = _orchestrator(with_decode=False)
    with pytest.raises(OrchestratorError, match="no decode instance"):
        asyncio.run(_all(orch))
    assert given_up == [b"kv-of-r-p1"]


def test_a_decode_that_failed_before_streaming_gives_up_that_attempts_handle_only():
    orch, _, given_up = _orchestrator(decode="fail once")
    with pytest.raises(OrchestratorError, match="before the first token"):
        asyncio.run(_all(orch))
    assert given_up == [b"kv-of-r-p1"]
    orch, _, given_up = _orchestrator(decode="fail once", policy=RoutingPolicy(max_decode_attempts=2), num_decode=2)
    assert [g.token_ids for g in asyncio.run(_all(orch))] == [[7]]      # prefilled again, then served
    assert given_up == [b"kv-of-r-p1"]


def test_a_client_that_left_before_the_first_token_gives_its_handle_up():
    orch, clients, given_up = _orchestrator(decode="hang")

    async def go():
        task = asyncio.create_task(_all(orch))
        await asyncio.wait_for(clients["decode-0"].started.wait(), 5)   # decode has it, nothing streamed yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(go())
    assert given_up == [b"kv-of-r-p1"]
    assert orch.holds == {}


def test_a_client_that_left_while_prefill_answered_gives_the_request_up_by_id():
    """The handle may be on its way when the client leaves (prefill sent its final answer, the orchestrator has not
    read it): the request is given up by its sub-request id, which the exporter honours even for a prefill it
    schedules later."""
    orch, clients, given_up = _orchestrator(prefill="hang")

    async def go():
        task = asyncio.create_task(_all(orch))
        await asyncio.wait_for(clients["prefill-0"].started.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(go())
    assert given_up == [("prefill-0", "r-p1")] and orch.holds == {}


def test_a_prefill_that_answered_with_an_error_is_not_given_up():
    orch, _, given_up = _orchestrator(prefill="fail")
    with pytest.raises(OrchestratorError):
        asyncio.run(_all(orch))
    assert given_up == []


def test_the_service_gives_a_handle_up_to_the_exporter_that_issued_it(tmp_path, fp16_root):
    """FleetService.give_up_kv, as the orchestrator calls it, reaches a real exporter (in this process, tcp) with the
    fleet's key, off the event loop."""
    import time

    from tests.unit.gateway.test_fleet_reload import instance, write
    from trtpd.gateway.config import from_fleet_file
    from trtpd.gateway.service import FleetService
    from trtpd.kv.exporter import KvExporter
    from trtpd.kv.layout import KvLayout
    from trtpd.kv.pool import KvPool

    fleet_file = tmp_path / "fleet.json"
    write(fleet_file, fp16_root / "checkpoint", [instance("prefill-0", "prefill"), instance("decode-0", "decode")])
    svc = FleetService(from_fleet_file(fleet_file))
    layout = KvLayout(num_layers=2, num_kv_heads=2, head_size=16, tokens_per_block=8, dtype="fp16")
    exporter = KvExporter(KvPool(layout, 4), svc.key, transport="tcp", transfer_timeout_s=60.0)
    try:
        exporter.register("r-p1", [0, 1], 12)
        handle = exporter.complete("r-p1", 5)

        async def go():
            svc.give_up_kv("prefill-0", "r-p1", handle)   # returns at once: the exporter is told on a worker thread
            deadline = time.monotonic() + 10
            while exporter.num_pending and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        asyncio.run(go())
        assert exporter.num_pending == 0 and exporter.num_given_up == 1
        assert exporter.drain_released() == ["r-p1"]
    finally:
        exporter.close()


def test_a_request_given_up_by_id_is_released_now_and_never_exported_later(tmp_path):
    """The exporter's side of give-up by request id (the RELEASE with GIVE_UP_REQUEST, under the key's proof): an
    export of that request (the serving layer's "-suffix" ids included) is released, and one registered later is
    refused (its prefill is never computed); another request is untouched; without the key nothing happens."""
    from trtpd.kv.errors import KvTransferError
    from trtpd.kv.export_table import ExportAbandoned
    from trtpd.kv.exporter import KvExporter
    from trtpd.kv.handle import generate_key
    from trtpd.kv.importer import give_up_request
    from trtpd.kv.layout import KvLayout
    from trtpd.kv.pool import KvPool

    key = generate_key()
    layout = KvLayout(num_layers=2, num_kv_heads=2, head_size=16, tokens_per_block=8, dtype="fp16")
    exporter = KvExporter(KvPool(layout, 8), key, transport="tcp", transfer_timeout_s=60.0)
    endpoint = exporter.endpoint.split("://", 1)[1]
    try:
        exporter.register("r-p1-1a2b3c4d", [0, 1], 12)
        exporter.register("other-p1-00000000", [2, 3], 12)
        with pytest.raises(KvTransferError):
            give_up_request(endpoint, "r-p1", generate_key())    # another key: refused
        assert exporter.num_pending == 2
        assert give_up_request(endpoint, "r-p1", key) == "released"
        assert exporter.drain_released() == ["r-p1-1a2b3c4d"] and exporter.num_pending == 1
        assert give_up_request(endpoint, "r-p2", key) == "noted"   # not scheduled yet
        with pytest.raises(ExportAbandoned):
            exporter.register("r-p2-99999999", [4, 5], 12)
        exporter.register("r-p3-99999999", [4, 5], 12)              # another attempt is not affected
        assert exporter.num_pending == 2
    finally:
        exporter.close()
