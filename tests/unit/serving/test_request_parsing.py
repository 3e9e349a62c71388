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


# ---- part 2: bad sampling values and token ids, refused with the field named ---------------------------

from trtpd.engine.request import EngineRequest, check_tokens  # noqa: E402
from trtpd.kv.errors import KvHandleForgedError, KvLayoutMismatchError, KvTransferTimeoutError  # noqa: E402
from trtpd.serving.request_parsing import (error_kind, parse_entry, parse_word_list,  # noqa: E402
                                           refuse_parameters)


@pytest.mark.parametrize("name, value, message", [
    ("temperature", float("nan"), "temperature must be a finite number >= 0, got nan"),
    ("temperature", float("inf"), "temperature must be a finite number >= 0, got inf"),
    ("temperature", -1.0, "temperature must be a finite number >= 0"),
    ("runtime_top_p", float("nan"), "runtime_top_p must be in"),
    ("runtime_top_k", -2, "runtime_top_k must be >= 0"),
])
def test_bad_sampling_values_are_refused(name, value, message):
    dtype = np.int32 if name == "runtime_top_k" else np.float32
    with pytest.raises(RequestError, match=message):
        parse_request(getter(**BASE, **{name: np.array([[value]], dtype=dtype)}), {}, "r1", 0)


def test_tiny_temperature_is_accepted_and_greedy():
    req = parse_request(getter(**BASE, temperature=np.array([[1e-40]], dtype=np.float32)), {}, "r1", 0)
    assert req.sampling.is_greedy


def test_seed_must_be_an_unsigned_64_bit_integer():
    with pytest.raises(RequestError, match="seed must be an unsigned 64-bit integer"):
        parse_request(getter(**BASE, seed=np.array([[-1]], dtype=np.int64)), {}, "r1", 0)
    req = parse_request(getter(**BASE, seed=np.array([[2**64 - 1]], dtype=np.uint64)), {}, "r1", 0)
    assert req.sampling.seed == 2**64 - 1


@pytest.mark.parametrize("ids, message", [
    ([1, 5, 512], "input_ids\\[2\\] = 512 is outside the vocabulary \\[0, 512\\)"),
    ([1, -3, 9], "input_ids\\[1\\] = -3 is outside the vocabulary"),
])
def test_token_ids_outside_the_vocabulary_are_refused(ids, message):
    with pytest.raises(RequestError, match=message):
        check_tokens(EngineRequest("r1", ids, 4), vocab_size=512)
    check_tokens(EngineRequest("r1", [0, 511], 4), vocab_size=512)


def test_word_lists_in_the_tensorrt_llm_format():
    tensor = np.array([[[5, 6, 7, 9, 0], [3, 4, -1, -1, -1]]], dtype=np.int32)
    assert parse_word_list(tensor, "stop_words_list") == [[5, 6, 7], [9]]
    assert parse_word_list(np.array([[[0], [-1]]], dtype=np.int32), "stop_words_list") == []
    with pytest.raises(RequestError, match="stop_words_list.*shape"):
        parse_word_list(np.zeros((3, 2), dtype=np.int32), "stop_words_list")


def test_stop_and_bad_words_in_the_request():
    req = EngineRequest("r", [1, 2], 8, end_id=3, stop_words=[[5, 6]], bad_words=[[9], [2, 4]], min_tokens=2)
    assert req.banned_tokens([]) == {9, 4, 3}          # [2, 4]: the prompt ends with 2
    assert req.banned_tokens([7, 8]) == {9}            # min_tokens reached: end_id allowed
    assert req.hits_stop_word([7, 5, 6]) and not req.hits_stop_word([5, 7, 6])


class Tok:
    vocab_size = 512
    eos_id = 2

    def encode(self, text, add_bos=True):
        return [ord(c) % 512 for c in text]


@pytest.mark.parametrize("tensors, message", [
    ({"temperature": np.array([[np.nan]], dtype=np.float32)}, "temperature must be a finite number"),
    ({"top_k": np.array([[513]], dtype=np.int32)}, "top_k must be >= 0 \\(0: off\\) and <= the vocabulary size 512"),
    ({"top_p": np.array([[0.0]], dtype=np.float32)}, "top_p must be in \\(0, 1\\]"),
    ({"end_id": np.array([[600]], dtype=np.int32)}, "end_id must be a token id in \\[0, 512\\) or -1"),
    ({"beam_width": np.array([[4]], dtype=np.int32)}, "beam_width=4 is not supported"),
    ({"repetition_penalty": np.array([[1.2]], dtype=np.float32)}, "repetition_penalty=1.2"),
    ({"return_log_probs": np.array([[True]])}, "return_log_probs=True is not supported"),
    ({"min_length": np.array([[-1]], dtype=np.int32)}, "min_length must be >= 0"),
    ({"seed": np.array([[1]], dtype=np.uint64), "random_seed": np.array([[2]], dtype=np.uint64)},
     "seed \\(1\\) and random_seed \\(2\\) differ"),
])
def test_the_ensemble_entry_names_the_client_field(tensors, message):
    with pytest.raises(RequestError, match=message):
        parse_entry(getter(**tensors), Tok(), "request x")


def test_the_ensemble_entry_fills_in_defaults_and_encodes_words():
    out = parse_entry(getter(stop_words=np.array([b"ab", b"c"], dtype=np.object_),
                             beam_width=np.array([[1]], dtype=np.int32)), Tok(), "request x")
    # no end_id sent: the tokenizer's EOS (upstream's preprocessing); -1 only when the client says so
    assert out["end_id"].item() == Tok.eos_id and out["runtime_top_p"].item() == 1.0 and out["seed"].item() == 0
    explicit = parse_entry(getter(end_id=np.array([[-1]], dtype=np.int32)), Tok(), "request x")
    assert explicit["end_id"].item() == -1
    assert parse_word_list(out["stop_words_list"], "s") == [[97, 98], [99]]
    assert parse_word_list(out["bad_words_list"], "b") == []


def test_unknown_request_parameters_are_refused_by_name():
    with pytest.raises(RequestError, match="unknown or unsupported field\\(s\\) foo, tempurature"):
        refuse_parameters({"tempurature": 0.5, "foo": 1}, "request x")
    refuse_parameters({}, "request x")


def test_error_kind_blames_the_client_only_for_client_faults():
    assert error_kind(RequestError("x")) == "invalid_arg"
    assert error_kind(KvHandleForgedError("x")) == "invalid_arg"
    assert error_kind(KvLayoutMismatchError("x", [])) == "internal"
    assert error_kind(KvTransferTimeoutError("x")) == "unavailable"
    assert error_kind(RuntimeError("x")) == "internal"


def test_tensorrt_llm_sampling_inputs_at_their_neutral_values_are_accepted():
    f32 = lambda v: np.array([[v]], dtype=np.float32)   # noqa: E731
    req = parse_request(getter(**BASE, repetition_penalty=f32(1.0), presence_penalty=f32(0.0),
                               frequency_penalty=f32(0.0), len_penalty=f32(0.7), pad_id=np.array([[0]], np.int32),
                               embedding_bias=np.zeros((1, 32), np.float32)), {}, "r", 0)
    assert req.max_new_tokens == 4


@pytest.mark.parametrize("name, value, message", [
    ("repetition_penalty", np.array([[1.2]], np.float32), "repetition_penalty=1.2 is not supported"),
    ("presence_penalty", np.array([[0.5]], np.float32), "presence_penalty=0.5 is not supported"),
    ("frequency_penalty", np.array([[-0.5]], np.float32), "frequency_penalty=-0.5 is not supported"),
    ("embedding_bias", np.array([[0.0, 1.0]], np.float32), "embedding_bias with non-zero entries"),
])
def test_sampling_the_reference_backend_cannot_do_is_refused_by_name(name, value, message):
    with pytest.raises(RequestError, match=message):
        parse_request(getter(**BASE, **{name: value}), {}, "r7", 0)
