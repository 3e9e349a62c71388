"""Triton python models `preprocessing` (text -> input_ids, validated) and `postprocessing`
(output_ids -> text_output)."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpd.serving.pb import error_response, input_getter, model_parameters, request_label, tensor
from trtpd.serving.tokenizers import load_text_tokenizer


class Preprocessing:
    def initialize(self, args: dict) -> None:
        params = model_parameters(args)
        self.tokenizer = load_text_tokenizer(params["tokenizer_dir"])
        self.max_input_len = int(params["max_input_len"])
        self.max_output_len = int(params["max_output_len"])

    def _one(self, request):
        get = input_getter(request)
        who = request_label(request)
        texts = get("text_input")
        if texts is None or texts.size != 1:
            return error_response(f"{who}: text_input must hold exactly one prompt")
        raw = texts.reshape(-1)[0]
        raw = raw if isinstance(raw, bytes) else str(raw).encode()
        if not raw:
            return error_response(f"{who}: text_input is empty; send a non-empty prompt")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return error_response(f"{who}: text_input is not valid UTF-8 (byte {exc.start}: {exc.reason}); "
                                  f"send UTF-8 text")
        max_tokens = get("max_tokens")
        if max_tokens is None or max_tokens.size != 1:
            return error_response(f"{who}: max_tokens is required (one integer)")
        max_tokens = int(max_tokens.reshape(-1)[0])
        if not 1 <= max_tokens <= self.max_output_len:
            return error_response(f"{who}: max_tokens must be between 1 and {self.max_output_len}, got {max_tokens}")
        ids = self.tokenizer.encode(text)
        if len(ids) > self.max_input_len:
            return error_response(f"{who}: prompt is {len(ids)} tokens, above the maximum input length "
                                  f"{self.max_input_len}; shorten the prompt")
        return pb_utils.InferenceResponse(output_tensors=[
            tensor("input_ids", np.array([ids], dtype=np.int32)),
            tensor("input_lengths", np.array([[len(ids)]], dtype=np.int32)),
            tensor("request_output_len", np.array([[max_tokens]], dtype=np.int32)),
        ])

    def execute(self, requests):
        return [self._one(r) for r in requests]


class Postprocessing:
    def initialize(self, args: dict) -> None:
        self.tokenizer = load_text_tokenizer(model_parameters(args)["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            ids = input_getter(request)("output_ids")
            tokens = [] if ids is None else [int(t) for t in ids.reshape(-1)]
            text = self.tokenizer.decode(tokens).encode("utf-8")
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                tensor("text_output", np.array([[text]], dtype=np.object_))]))
        return responses
