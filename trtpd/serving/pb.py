"""Small helpers over triton_python_backend_utils (only importable inside the python backend stub)."""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpd import error_kinds

ERROR_CODES = {
    "invalid_arg": "INVALID_ARG",
    "unavailable": "UNAVAILABLE",
    "internal": "INTERNAL",
    "cancelled": "CANCELLED",
    "unsupported": "UNSUPPORTED",
    "not_found": "NOT_FOUND",
    "already_exists": "ALREADY_EXISTS",
    "unknown": "UNKNOWN",
}


def model_parameters(args: dict) -> dict[str, str]:
    config = json.loads(args["model_config"])
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def triton_error(message: str, kind: str = "invalid_arg", tagged: bool = True):
    """A TritonError with the code of `kind`, its message tagged with the kind (error_kinds.py: the code
    does not survive Triton 2.51's decoupled path, the tag does); untagged: the message as it is."""
    code = getattr(pb_utils.TritonError, ERROR_CODES.get(kind, "INTERNAL"), None)
    message = error_kinds.tag(message, kind) if tagged else message
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


def kind_of(error) -> str:
    """The kind (ERROR_CODES key) of a pb_utils.TritonError, e.g. a BLS sub-request's response.error(), so an
    orchestrator passes on the role model's code instead of blaming the client for every failure."""
    _, tagged = error_kinds.parse(error.message())
    if tagged is not None:   # a trtpd model's own verdict
        return tagged
    code = error.code() if hasattr(error, "code") else None
    for kind, name in ERROR_CODES.items():
        if code is not None and code == getattr(pb_utils.TritonError, name, object()):
            return kind
    return "internal"


def trtllm_error_response(message: str):
    """An error response as TensorRT-LLM's tensorrtllm backend answers every failure (fillTritonResponse in
    triton_backend/inflight_batcher_llm/src/model_instance_state.cc): INTERNAL, the message untagged."""
    return pb_utils.InferenceResponse(output_tensors=[], error=triton_error(message, "internal", tagged=False))


def executor_failed_response(request_id: str, message: str):
    """A request the engine failed after admitting it, answered as TensorRT-LLM's tensorrtllm backend does:
    "Executor failed process requestId <id> due to the following error: <the executor's words>"."""
    return trtllm_error_response(error_kinds.executor_failed(request_id, message))


def error_response(message: str, kind: str = "invalid_arg"):
    return pb_utils.InferenceResponse(output_tensors=[], error=triton_error(message, kind))


def input_getter(request):
    def get(name: str):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()
    return get


def request_label(request) -> str:
    rid = request.request_id()
    return f"request {rid}" if rid else "request"


def tensor(name: str, value) -> "pb_utils.Tensor":
    return pb_utils.Tensor(name, np.ascontiguousarray(value))
