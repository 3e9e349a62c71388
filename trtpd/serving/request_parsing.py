"""Turn a role model's Triton request (tensors + parameters) into an EngineRequest. Pure: the Triton
shell passes a getter for its input tensors, so this is tested without a server."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from trtpd.engine.request import EngineRequest, RequestError, RequestType
from trtpd.engine.sampler import SamplingParams

GetInput = Callable[[str], "np.ndarray | None"]


def _scalar(get: GetInput, name: str, default=None):
    value = get(name)
    if value is None:
        return default
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise RequestError(f"input {name!r} must hold one value per request, got shape {np.asarray(value).shape}")
    return flat[0].item()


def parse_parameters(raw: "str | dict | None") -> dict:
    if not raw:
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        raise RequestError(f"request parameters are not valid JSON: {raw[:80]!r}") from None


def parse_request_type(parameters: dict) -> RequestType:
    value = parameters.get("request_type")
    if value in (None, ""):
        return RequestType.CONTEXT_AND_GENERATION
    try:
        return RequestType(str(value).lower())
    except ValueError:
        allowed = ", ".join(t.value for t in RequestType)
        raise RequestError(f"request parameter request_type={value!r} is not one of {allowed}") from None


def parse_request(get: GetInput, parameters: dict, request_id: str, arrival_s: float) -> EngineRequest:
    input_ids = get("input_ids")
    prompt = [] if input_ids is None else [int(t) for t in np.asarray(input_ids).reshape(-1)]
    length = _scalar(get, "input_lengths")
    if length is None:
        raise RequestError(f"request {request_id}: missing required input input_lengths")
    if input_ids is not None and int(length) != len(prompt):
        raise RequestError(f"request {request_id}: input_lengths is {length} but input_ids has {len(prompt)} tokens")
    max_new = _scalar(get, "request_output_len")
    if max_new is None:
        raise RequestError(f"request {request_id}: missing required input request_output_len")
    if int(max_new) < 1:
        raise RequestError(f"request {request_id}: request_output_len must be >= 1, got {max_new}")
    end_id = _scalar(get, "end_id")
    try:
        sampling = SamplingParams(temperature=float(_scalar(get, "temperature", 0.0)),
                                  top_k=int(_scalar(get, "runtime_top_k", 0)),
                                  top_p=float(_scalar(get, "runtime_top_p", 1.0)),
                                  seed=int(_scalar(get, "seed", 0)))
    except ValueError as exc:
        raise RequestError(f"request {request_id}: {exc}") from None
    blob = get("context_phase_params")
    return EngineRequest(
        request_id=request_id, prompt_token_ids=prompt, max_new_tokens=int(max_new),
        request_type=parse_request_type(parameters), sampling=sampling,
        end_id=None if end_id is None or int(end_id) < 0 else int(end_id),
        streaming=bool(_scalar(get, "streaming", False)),
        context_phase_params=None if blob is None else np.asarray(blob, dtype=np.uint8).reshape(-1).tobytes(),
        arrival_s=arrival_s, layerwise_kv_transfer=_flag(parameters, "layerwise_kv_transfer"))


def _flag(parameters: dict, name: str) -> bool:
    value = parameters.get(name, False)
    if isinstance(value, str):
        return value.lower() in ("1", "true", "yes")
    return bool(value)
