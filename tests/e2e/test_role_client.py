"""The gateway's gRPC client of one role instance (trtpd.transports.triton_grpc) against a real tritonserver:
a request that got its final response ends its stream cleanly (half-closed, the call finished OK), none is
left open, and one the caller stops early is cancelled (its KV freed at once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc.aio import _call

from trtpd.deploy.spec import KEY_FILE
from trtpd.transports.triton_grpc import RoleClient
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


def test_a_role_model_that_declares_only_the_tensorrtllm_outputs_is_served(fp16_root, tmp_path):
    """TensorRT-LLM's `tensorrt_llm` model declares none of trtpd's perf outputs, and Triton refuses a request for
    an output its model does not declare. The role client asks only for what the model's metadata lists. Here:
    the reference colocated model with its config cut down to the tensorrtllm backend's outputs (names from the
    GPU repository's config, tests/golden/trtllm), in a real tritonserver."""
    import re

    from trtpd.deploy.spec import ReferenceDeployment, key_file_for
    from trtpd.fleet.tritonserver import start_server, stop_server, wait_ready
    from trtpd.perf_outputs import PERF_OUTPUTS
    from trtpd.repo.reference import render_reference_repository

    repo = render_reference_repository(ReferenceDeployment(fp16_root, mode="colocated"), tmp_path / "repo")
    config = repo / "colocated" / "config.pbtxt"
    text = config.read_text()
    for name in PERF_OUTPUTS:
        text = re.sub(r'\s*\{ name: "%s"[^}]*\},?' % name, "", text)
    config.write_text(text)
    assert not any(f'"{n}"' in text for n in PERF_OUTPUTS) and '"output_ids"' in text
    server = start_server(repo, tmp_path / "state")
    try:
        wait_ready(server, 180)

        async def go():
            role = RoleClient("colocated-0", server.grpc_url, "colocated", load_or_create_key_file(key_file_for(repo)))
            try:
                assert await role.outputs() == ("output_ids", "sequence_length", "context_phase_params")
                return [c async for c in role.stream("trt-1", "", [1, 2, 3, 4, 5], SamplingInputs(max_new_tokens=3))]
            finally:
                await role.close()
        chunks = asyncio.run(go())
        assert chunks[-1].final and sum(len(c.token_ids) for c in chunks) == 3
        assert all(c.perf == {} for c in chunks)          # no perf outputs: none asked for, none read
    finally:
        stop_server(server)
