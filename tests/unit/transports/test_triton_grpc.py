"""The Triton transport's reading of a role model's error on a context-only sub-request: TensorRT-LLM's backend
answers a context phase that ended the request (its first token was the end id or completed a stop word) with
"Error encountered while populating response: contextParams must be present in the response" (its TLLM_THROW text
wrapped in file, line and maybe a stack; docs/twin.md). That is the request ending, not a failure to retry
elsewhere; on any other sub-request, and any other error, it stays an error."""

from __future__ import annotations

import asyncio

import pytest
from tritonclient.utils import InferenceServerException

from trtpd import error_kinds
from trtpd.orchestration.transport import RoleError, SamplingInputs
from trtpd.transports.triton_grpc import OUTPUTS, RoleClient

# what TensorRT-LLM's backend answers (model_instance_state.cc fillTritonResponse's catch around TLLM_THROW)
UPSTREAM = (f"Error encountered while populating response: [TensorRT-LLM][ERROR] {error_kinds.CONTEXT_PARAMS_MISSING}"
            " (/src/triton_backend/inflight_batcher_llm/src/model_instance_state.cc:1432)\n1 0x7f2a libtensorrt")


class _Call:
    """One stream_infer call that answers a single error response."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.cancelled = False

    def __aiter__(self):
        return self._responses()

    async def _responses(self):
        yield None, InferenceServerException(self.message)

    def cancel(self) -> None:
        self.cancelled = True


class _Client:
    def __init__(self, message: str) -> None:
        self.call = _Call(message)

    def stream_infer(self, inputs_iterator):
        return self.call

    async def close(self) -> None:
        pass


def _stream(message: str, request_type: str):
    fake = _Client(message)

    async def run():    # the grpc client is made on the running loop, then stood in for
        client = RoleClient("prefill-0", "127.0.0.1:1", "prefill", None, layerwise=False)
        await client.close()
        client.client, client._outputs = fake, OUTPUTS
        return [c async for c in client.stream("r-p1", request_type, [1, 2, 3], SamplingInputs(4, end_id=2))]
    return asyncio.run(run()), fake.call


@pytest.mark.parametrize("message", [error_kinds.context_params_missing(), UPSTREAM,
                                     f"in ensemble 'ensemble', {error_kinds.context_params_missing()}"])
def test_a_context_phase_that_ended_the_request_is_its_end_not_an_error(message):
    (chunk,), call = _stream(message, "context_only")
    assert (chunk.token_ids, chunk.handle, chunk.final, chunk.ended) == ([], None, True, True)
    assert not call.cancelled          # the error was the final response: nothing to cancel


def test_the_same_words_on_another_sub_request_and_other_errors_on_context_only_stay_errors():
    with pytest.raises(RoleError) as info:
        _stream(error_kinds.context_params_missing(), "generation_only")
    assert info.value.kind == "internal"
    with pytest.raises(RoleError) as info:
        _stream("Error encountered while populating response: output_ids tensor must be present", "context_only")
    assert info.value.kind == "internal"
