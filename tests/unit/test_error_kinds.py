"""The error-kind tag: appended once, read back, absent on untagged messages."""

import pytest

from trtpd import error_kinds
from trtpd.transports.triton_grpc import _role_error


def test_tag_and_parse_round_trip():
    tagged = error_kinds.tag("KV dtype differs", "internal")
    assert tagged == "KV dtype differs [trtpd:internal]"
    assert error_kinds.parse(tagged) == ("KV dtype differs", "internal")
    assert error_kinds.parse("in ensemble 'ensemble', " + tagged) == ("in ensemble 'ensemble', KV dtype differs",
                                                                     "internal")


def test_retagging_replaces_the_kind_and_unknown_kinds_become_internal():
    assert error_kinds.tag(error_kinds.tag("x", "invalid_arg"), "unavailable") == "x [trtpd:unavailable]"
    assert error_kinds.tag("x", "nonsense") == "x [trtpd:internal]"


def test_an_untagged_or_foreign_tag_reads_as_unknown():
    assert error_kinds.parse("Stub process is not healthy.") == ("Stub process is not healthy.", None)
    assert error_kinds.parse("x [trtpd:bogus]") == ("x", None)


# the backend's own texts (error_kinds.py names the upstream lines); a TllmException's text is
# "<message> (<file>:<line>)\n<stack>"
_TRTLLM = [
    "Executor failed process requestId 7 due to the following error: [TensorRT-LLM][ERROR] Assertion failed: "
    "The number of context tokens (8195) exceeds the limit value (8192) (/src/tensorrt_llm/batch_manager/x.cpp:12)",
    "Error encountered while populating response: output_ids tensor must be present in list of output tensors",
    "in ensemble 'ensemble', [TensorRT-LLM][ERROR] Assertion failed: Invalid request (/src/executor.cpp:3)\n1 0x7f",
]


@pytest.mark.parametrize("message", _TRTLLM)
def test_tensorrt_llm_backend_errors_are_this_requests_failure_not_an_instance_gone(message):
    assert error_kinds.parse(message)[1] is None          # untagged
    assert error_kinds.untagged_kind(message) == "internal"
    assert _role_error(message, "prefill-0").kind == "internal"


@pytest.mark.parametrize("message", ["Stub process 'prefill_0_0' is not healthy.",
                                     "Request for unknown model: 'prefill' is not found"])
def test_tritons_own_untagged_errors_still_mean_the_instance_is_unavailable(message):
    assert error_kinds.untagged_kind(message) is None
    assert _role_error(message, "prefill-0").kind == "unavailable"


def test_a_tag_wins_over_the_words():
    message = error_kinds.tag("Executor failed process requestId 7 due to the following error: x", "invalid_arg")
    assert _role_error(message, "prefill-0").kind == "invalid_arg"


def test_the_twins_executor_failure_is_read_as_the_backends_own():
    """The twin's role model answers an engine-side failure in the backend's words (serving/pb.py
    executor_failed_response): untagged, and read as "internal" like TensorRT-LLM's."""
    message = error_kinds.executor_failed("r-1", "KV transfer failed: export 'r-1-p1' not found")
    assert message == ("Executor failed process requestId r-1 due to the following error: KV transfer failed: "
                       "export 'r-1-p1' not found")
    assert error_kinds.parse(message) == (message, None) and error_kinds.untagged_kind(message) == "internal"
