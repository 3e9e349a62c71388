"""Triton's `postprocessing` model (trtpd/serving/text_models.py) as the ensemble drives it when streaming: one
call per streamed response, no state kept between calls. Each call gets the chunk's output_ids and, from the entry
model, the tokens before it (prefix_ids) and whether it is the last (is_final); the texts it returns concatenate
to the whole completion's decode, spaces and split characters included. The model runs here over a stand-in for
triton_python_backend_utils (the real one exists only inside tritonserver's python stub)."""

from __future__ import annotations

import importlib
import json
import sys
import types

import numpy as np
import pytest

from trtpd.engine import corpus
from trtpd.engine.tokenizer import BYTE_BASE, SPACE, Tokenizer
from trtpd.serving.stub_watch import STATE_ENV

from tests.unit.test_detokenize import TEXT, unigram_metaspace


class FakeTensor:
    def __init__(self, name: str, value) -> None:
        self._name, self._value = name, np.asarray(value)

    def name(self) -> str:
        return self._name

    def as_numpy(self):
        return self._value


class FakeResponse:
    def __init__(self, output_tensors, error=None) -> None:
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors}
        self.error = error


class FakeRequest:
    def __init__(self, **inputs) -> None:
        self.inputs = {name: FakeTensor(name, value) for name, value in inputs.items()}

    def request_id(self) -> str:
        return ""


def fake_pb_utils() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor, pb.InferenceResponse = FakeTensor, FakeResponse
    pb.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    pb.TritonError = type("TritonError", (Exception,), {})
    return pb


@pytest.fixture
def postprocessing(monkeypatch):
    """A factory: the Postprocessing model initialized over the tokenizer.json in `folder`."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    for name in ("trtpd.serving.text_models", "trtpd.serving.pb"):   # imported afresh over the stand-in
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delenv(STATE_ENV, raising=False)
    text_models = importlib.import_module("trtpd.serving.text_models")

    def make(folder):
        model = text_models.Postprocessing()
        model.initialize({"model_name": "postprocessing", "model_config": json.dumps(
            {"parameters": {"tokenizer_dir": {"string_value": str(folder)}}})})
        return model
    yield make
    for name in ("trtpd.serving.text_models", "trtpd.serving.pb"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module", params=["sentencepiece", "llama"])
def tokenizer_dir(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "sentencepiece":
        unigram_metaspace(folder)
    else:
        Tokenizer.train(corpus.training_corpus(), 1536).save(folder / "tokenizer.json")
    return folder


def chunk_request(ids: list[int], prefix: list[int], is_final: bool, prompt_len: int = 5) -> FakeRequest:
    """The tensors the ensemble hands postprocessing for one streamed response (batch 1, beam 1)."""
    inputs = {"output_ids": np.array(ids, dtype=np.int32).reshape(1, 1, len(ids)),
              "sequence_length": np.array([[prompt_len + len(prefix) + len(ids)]], dtype=np.int32),
              "is_final": np.array([[is_final]], dtype=bool)}
    if prefix:   # the first chunk has none: an absent optional tensor, not a zero-length one
        inputs["prefix_ids"] = np.array([prefix], dtype=np.int32)
    return FakeRequest(**inputs)


def text_of(response: FakeResponse) -> str:
    assert response.error is None, response.error
    [[text]] = response.outputs["text_output"]
    return text.decode("utf-8")


def streamed(model, ids: list[int], size: int) -> list[str]:
    texts = []
    for at in range(0, len(ids), size):
        [response] = model.execute([chunk_request(ids[at:at + size], ids[:at], at + size >= len(ids))])
        texts.append(text_of(response))
    return texts


@pytest.mark.parametrize("size", [1, 3])
def test_streamed_chunk_texts_concatenate_to_the_whole_decode(postprocessing, tokenizer_dir, size):
    model = postprocessing(tokenizer_dir)
    tok = model.tokenizer
    ids = tok.encode(TEXT, add_bos=False)
    assert sum(tok.token_text(i).startswith(SPACE) for i in ids) > 5
    texts = streamed(model, ids, size)
    assert "".join(texts) == TEXT == tok.decode(ids)
    assert any(t.startswith(" ") for t in texts[1:])


def test_a_character_split_across_chunks_waits_for_its_last_byte(postprocessing, tmp_path):
    tok = Tokenizer.train(corpus.training_corpus(), 1536)
    tok.save(tmp_path / "tokenizer.json")
    model = postprocessing(tmp_path)
    ids = tok.encode("naïve café 日本語 🚀", add_bos=False)
    assert any(BYTE_BASE <= i < BYTE_BASE + 256 for i in ids)
    texts = streamed(model, ids, 1)
    assert "".join(texts) == "naïve café 日本語 🚀" and not any("\ufffd" in t for t in texts)
    truncated = tok.encode("ok", add_bos=False) + [BYTE_BASE + 0xF0, BYTE_BASE + 0x9F]   # the stream ends mid-character
    assert "".join(streamed(model, truncated, 1)) == tok.decode(truncated) == "ok\ufffd"
    # a stream that ends at its end id ends with an empty final response (bls_model.py's complete()): it flushes
    held = [text_of(r) for r in model.execute([chunk_request(truncated[-1:], truncated[:-1], False),
                                                chunk_request([], truncated, True)])]
    assert held == ["", "\ufffd"]


def test_a_whole_response_without_prefix_is_decoded_as_before(postprocessing, tokenizer_dir):
    """A non-streamed response (every token, final), or an entry model that sends no prefix_ids / is_final:
    output_ids decoded on their own, as this model always did."""
    model = postprocessing(tokenizer_dir)
    ids = model.tokenizer.encode(TEXT, add_bos=False)
    bare = FakeRequest(output_ids=np.array(ids, dtype=np.int32).reshape(1, 1, -1),
                       sequence_length=np.array([[len(ids)]], dtype=np.int32))
    assert [text_of(r) for r in model.execute([bare, chunk_request(ids, [], True)])] == [TEXT, TEXT]


def test_requests_of_different_streams_in_one_call_are_independent(postprocessing, tokenizer_dir):
    model = postprocessing(tokenizer_dir)
    a = model.tokenizer.encode(TEXT, add_bos=False)
    b = model.tokenizer.encode("the decode server", add_bos=False)
    responses = model.execute([chunk_request(a[3:4], a[:3], False), chunk_request(b[:1], [], False),
                               chunk_request(b[1:2], b[:1], False)])
    tok = model.tokenizer
    assert [text_of(r) for r in responses] == [tok.decode(a[:4])[len(tok.decode(a[:3])):], "the", " decode"]
