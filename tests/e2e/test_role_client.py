"""The gateway's gRPC client of one role instance (trtpd.gateway.role_client) against a real tritonserver:
a request that got its final response ends its stream cleanly (half-closed, the call finished OK), none is
left open, and one the caller stops early is cancelled (its KV freed at once)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import grpc
import pytest
from grpc.aio._call import StreamStreamCall

from trtpd.deploy.spec import KEY_FILE
from trtpd.gateway.role_client import RoleClient, SamplingInputs
from trtpd.kv.handle import load_or_create_key_file

pytestmark = pytest.mark.e2e


def _client(server) -> RoleClient:
    repo = Path(server.server.repo)
    return RoleClient("colocated-0", server.grpc_url, "colocated",
                      load_or_create_key_file(repo.parent / f"{repo.name}.{KEY_FILE}"))


def _calls() -> list[StreamStreamCall]:
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, StreamStreamCall)]


def test_complete_requests_end_their_streams_and_stopped_ones_are_cancelled(fp16_coloc):
    async def go():
        role = _client(fp16_coloc)
        before = set(map(id, _calls()))
        for i in range(20):
            chunks = [c async for c in role.stream(f"rc-{i}", "", [1, 2, 3, 4, 5], SamplingInputs(max_new_tokens=3))]
            assert chunks[-1].final and sum(len(c.token_ids) for c in chunks) == 3
        deadline = asyncio.get_running_loop().time() + 10
        while True:   # the server ends each stream once it is half-closed: every call finishes, none cancelled
            ours = [c for c in _calls() if id(c) not in before]
            if all(c.done() for c in ours) or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        assert all(c.done() for c in ours), f"{sum(not c.done() for c in ours)} of {len(ours)} streams still open"
        assert {await c.code() for c in ours} <= {grpc.StatusCode.OK}
        # a consumer that stops after the first token: its call is cancelled, not left streaming
        known = set(map(id, _calls()))
        stream = role.stream("rc-stop", "", [1, 2, 3, 4, 5], SamplingInputs(max_new_tokens=64))
        first = await stream.__anext__()
        assert first.token_ids and not first.final
        [call] = [c for c in _calls() if id(c) not in known]
        assert not call.done()
        await stream.aclose()
        assert call.done() and await call.code() == grpc.StatusCode.CANCELLED
        await role.close()
    asyncio.run(go())
