"""Triton python models `preprocessing` (text -> input_ids, validated) and `postprocessing`
(output_ids -> text_output, streamed chunk by chunk after the tokens before each: trtpd/detokenize.py).

Preprocessing is the ensemble's edge: it refuses request parameters (HTTP generate's unknown JSON keys),
validates every sampling field under the name the client used, and emits the role-model tensors
(TensorRT-LLM names: stop_words_list, bad_words_list, min_tokens, ...) with defaults filled in.
text_output holds the completion only (exclude_input_in_output=true; false is refused: Triton 2.51 does
not let the postprocessing step of a decoupled ensemble read ensemble inputs such as text_input).
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpd.detokenize import text_delta
from trtpd.engine.request import RequestError
from trtpd.serving.pb import error_response, input_getter, model_parameters, request_label, tensor
from trtpd.serving.request_parsing import parse_entry, parse_parameters, refuse_parameters
from trtpd.serving.stub_watch import StubWatch
from trtpd.engine.text_tokenizers import load_text_tokenizer


class Preprocessing:
    def initialize(self, args: dict) -> None:
        params = model_parameters(args)
        self.tokenizer = load_text_tokenizer(params["tokenizer_dir"])
        self.max_input_len = int(params["max_input_len"])
        self.max_output_len = int(params["max_output_len"])
        self.stub_watch = StubWatch.from_env(args["model_name"], args.get("model_instance_name", ""))

    def finalize(self) -> None:
        if self.stub_watch is not None:
            self.stub_watch.stop()   # an orderly exit, not a death

    def _one(self, request):
        who = request_label(request)
        try:
            return self._parse(request, who)
        except RequestError as exc:
            return error_response(str(exc), exc.kind)

    def _parse(self, request, who: str):
        get = input_getter(request)
        refuse_parameters(parse_parameters(request.parameters()), who)
        text = self._text(get, who)
        max_tokens = get("max_tokens")
        if max_tokens is None or max_tokens.size != 1:
            raise RequestError(f"{who}: max_tokens is required (one integer)")
        max_tokens = int(max_tokens.reshape(-1)[0])
        if not 1 <= max_tokens <= self.max_output_len:
            raise RequestError(f"{who}: max_tokens must be between 1 and {self.max_output_len}, got {max_tokens}")
        sampling = parse_entry(get, self.tokenizer, who)
        ids = self.tokenizer.encode(text)
        if len(ids) > self.max_input_len:
            raise RequestError(f"{who}: prompt is {len(ids)} tokens, above the maximum input length "
                               f"{self.max_input_len}; shorten the prompt")
        return pb_utils.InferenceResponse(output_tensors=[
            tensor("input_ids", np.array([ids], dtype=np.int32)),
            tensor("input_lengths", np.array([[len(ids)]], dtype=np.int32)),
            tensor("request_output_len", np.array([[max_tokens]], dtype=np.int32)),
        ] + [tensor(name, value) for name, value in sampling.items()])

    @staticmethod
    def _text(get, who: str) -> str:
        texts = get("text_input")
        if texts is None or texts.size != 1:
            raise RequestError(f"{who}: text_input must hold exactly one prompt")
        raw = texts.reshape(-1)[0]
        raw = raw if isinstance(raw, bytes) else str(raw).encode()
        if not raw:
            raise RequestError(f"{who}: text_input is empty; send a non-empty prompt")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError(f"{who}: text_input is not valid UTF-8 (byte {exc.start}: {exc.reason}); "
                               f"send UTF-8 text") from None

    def execute(self, requests):
        return [self._one(r) for r in requests]


class Postprocessing:
    def initialize(self, args: dict) -> None:
        self.tokenizer = load_text_tokenizer(model_parameters(args)["tokenizer_dir"])
        self.stub_watch = StubWatch.from_env(args["model_name"], args.get("model_instance_name", ""))

    def finalize(self) -> None:
        if self.stub_watch is not None:
            self.stub_watch.stop()   # an orderly exit, not a death

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        """One response's text. Streaming, the ensemble calls this once per response of the entry model, which
        sends the completion's tokens before this response (prefix_ids) and whether it is the last (is_final):
        the text is what output_ids add after prefix_ids (trtpd/detokenize.py). Without them (a whole response,
        or an entry model that does not send them), output_ids are decoded on their own."""
        get = input_getter(request)
        new, prefix, is_final = get("output_ids"), get("prefix_ids"), get("is_final")
        text = text_delta(self.tokenizer, _ids(prefix), _ids(new),
                          is_final=True if is_final is None else bool(is_final.reshape(-1)[0]))
        return pb_utils.InferenceResponse(output_tensors=[
            tensor("text_output", np.array([[text.encode("utf-8")]], dtype=np.object_))])


def _ids(value) -> list[int]:
    return [] if value is None else value.reshape(-1).tolist()   # Python ints, at C speed (a prefix grows)
