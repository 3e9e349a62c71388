import numpy as np
import pytest

from trtpd.engine.request import RequestError, RequestType
from trtpd.serving.request_parsing import parse_parameters, parse_request


def getter(**tensors):
    return lambda name: tensors.get(name)


BASE = {"input_ids": np.array([[1, 5, 9]], dtype=np.int32), "input_lengths": np.array([[3]], dtype=np.int32),
        "request_output_len": np.array([[4]], dtype=np.int32)}


def test_parses_the_tensorrt_llm_interface():
    blob = np.frombuffer(b"handle", dtype=np.uint8).reshape(1, -1)
    req = parse_request(getter(**BASE, end_id=np.array([[2]], dtype=np.int32), streaming=np.array([[True]]),
                               context_phase_params=blob, runtime_top_k=np.array([[5]], dtype=np.int32),
                               temperature=np.array([[0.7]], dtype=np.float32)),
                        {"request_type": "generation_only"}, "r1", 1.0)
    assert req.prompt_token_ids == [1, 5, 9] and req.max_new_tokens == 4 and req.end_id == 2
    assert req.request_type is RequestType.GENERATION_ONLY and req.streaming
    assert req.context_phase_params == b"handle" and req.sampling.top_k == 5
    assert not req.layerwise_kv_transfer


def test_defaults_and_flags():
    req = parse_request(getter(**BASE, end_id=np.array([[-1]], dtype=np.int32)),
                        parse_parameters('{"request_type": "context_only", "layerwise_kv_transfer": true}'), "r", 0)
    assert req.end_id is None and req.request_type is RequestType.CONTEXT_ONLY and req.layerwise_kv_transfer
    assert parse_request(getter(**BASE), {}, "r", 0).request_type is RequestType.CONTEXT_AND_GENERATION


@pytest.mark.parametrize("tensors, params, message", [
    ({**BASE, "input_lengths": np.array([[4]], dtype=np.int32)}, {}, "input_lengths is 4 but input_ids has 3"),
    ({**BASE, "request_output_len": np.array([[0]], dtype=np.int32)}, {}, "request_output_len must be >= 1"),
    ({k: v for k, v in BASE.items() if k != "request_output_len"}, {}, "missing required input request_output_len"),
    (BASE, {"request_type": "prefill_please"}, "request_type='prefill_please' is not one of"),
    ({**BASE, "runtime_top_p": np.array([[1.5]], dtype=np.float32)}, {}, "runtime_top_p must be in"),
])
def test_bad_requests_name_the_field(tensors, params, message):
    with pytest.raises(RequestError, match=message):
        parse_request(getter(**tensors), params, "r9", 0)


def test_bad_parameter_json():
    with pytest.raises(RequestError, match="not valid JSON"):
        parse_parameters("{nope")
