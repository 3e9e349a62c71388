"""The gateway's gRPC client of one role instance (trtpd.gateway.role_client) against a real tritonserver:
a request that got its final response ends its stream cleanly (half-closed, the call finished OK), none is
left open, and one the caller stops early is cancelled (its KV freed at once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc.aio import _call

from trtpd.deploy.spec import KEY_FILE
from trtpd.gateway.role_client import RoleClient
from trtpd.orchestration.transport import SamplingInputs
from trtpd.kv.handle import load_or_create_key_file

pytestmark = pytest.mark.e2e


def _client(server) -> RoleClient:
    repo = Path(server.server.repo)
    return RoleClient("colocated-0", server.grpc_url, "colocated",
                      load_or_create_key_file(repo.parent / f"{repo.name}.{KEY_FILE}"))


@pytest.fixture
def calls(monkeypatch) -> list:
    """Every gRPC stream call made while the test runs, kept alive to be asked how it ended."""
    made: list = []
    init = _call.StreamStreamCall.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(_call.StreamStreamCall, "__init__", record)
    return made


def test_complete_requests_end_their_streams_and_stopped_ones_are_cancelled(fp16_coloc, calls):
    async def go():
        role = _client(fp16_coloc)
        for i in range(20):
            chunks = [c async for c in role.stream(f"rc-{i}", "", [1, 2, 3, 4, 5], SamplingInputs(max_new_tokens=3))]
            assert chunks[-1].final and sum(len(c.token_ids) for c in chunks) == 3
        assert len(calls) == 20
        deadline = asyncio.get_running_loop().time() + 10
        while not all(c.done() for c in calls) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)   # the server ends each stream once it is half-closed
        assert all(c.done() for c in calls), f"{sum(not c.done() for c in calls)} of 20 streams still open"
        assert {await c.code() for c in calls} == {grpc.StatusCode.OK}
        # a consumer that stops after the first token: its call is cancelled, not left streaming
        stream = role.stream("rc-stop", "", [1, 2, 3, 4, 5], SamplingInputs(max_new_tokens=64))
        first = await stream.__anext__()
        assert first.token_ids and not first.final
        call = calls[-1]
        assert len(calls) == 21 and not call.done()
        await stream.aclose()
        assert call.done() and await call.code() == grpc.StatusCode.CANCELLED
        await role.close()
    asyncio.run(go())
