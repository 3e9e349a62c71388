"""Who is at fault for an error, carried inside its message.

Triton 2.51 drops the error code of a decoupled python model's response on the way out (its HTTP
generate endpoints answer 400 for every code, and gRPC stream errors carry only a message), so trtpd's
models end every error message with a tag naming its kind. A frontend that can tell the client the
truth (the gateway: 400 for the client's fault, 500/503 for ours) reads it back with `parse`.
"""

from __future__ import annotations

import re

KINDS = ("invalid_arg", "unavailable", "internal", "cancelled", "unsupported", "not_found", "already_exists",
         "unknown")
_TAG = re.compile(r"\s*\[trtpd:(\w+)\]\s*$")


def tag(message: str, kind: str) -> str:
    """`message` with its kind appended once (an already tagged message is re-tagged)."""
    return f"{_TAG.sub('', message)} [trtpd:{kind if kind in KINDS else 'internal'}]"


def parse(message: str) -> tuple[str, str | None]:
    """(the message without its tag, the kind it names or None when untagged)."""
    match = _TAG.search(message)
    if match is None:
        return message, None
    kind = match.group(1)
    return message[:match.start()], kind if kind in KINDS else None


# TensorRT-LLM's Triton backend (tensorrtllm, inflight_batcher_llm) answers every failure with
# TRITONSERVER_ERROR_INTERNAL and no trtpd tag: a request the executor failed ("Executor failed process requestId
# <id> due to the following error: <executor's words>"), a response it could not fill ("Error encountered while
# populating response: ..."), and a request it could not enqueue (the exception's own text, for TLLM_CHECK
# "[TensorRT-LLM][ERROR] Assertion failed: ..."). Sources: NVIDIA/TensorRT-LLM
# triton_backend/inflight_batcher_llm/src/model_instance_state.cc (fillTritonResponse; the enqueue path's catch
# -> sendEnqueueResponse) and cpp/include/tensorrt_llm/common/assert.h (throwRuntimeError), read at the indexed
# commit 0c8de69a; confirming them at v1.2.1 is on the first GPU box's list (docs/first-gpu-box.md, §3).
# Such an error is this request's failure on a live instance, not the instance gone: "internal", which the routing
# core retries on another instance as any server fault (trtpd/routing/failures.py) without marking this one
# unhealthy, and the gateway answers 500 if no attempt succeeds (503 was what an untagged error got before).
_TRTLLM_FORMS = ("Executor failed process requestId ", "Error encountered while populating response: ",
                 "[TensorRT-LLM][ERROR]")


def executor_failed(request_id: str, message: str) -> str:
    """The words of TensorRT-LLM's backend for a request its executor failed (the first of the forms above)."""
    return f"{_TRTLLM_FORMS[0]}{request_id} due to the following error: {message}"


# The backend's words for a context-only request whose executor result has no contextPhaseParams: fillTritonResponse
# (same file) does `TLLM_THROW("contextParams must be present in the response")` for REQUEST_TYPE_CONTEXT_ONLY and its
# catch answers "Error encountered while populating response: " + e.what(), INTERNAL, final. The executor leaves them
# out when the context phase finished the request (its first token was the end id or completed a stop word):
# llmRequest.cpp createResult sets contextPhaseParams only in the disaggregated context transmission state, and
# trtGptModelInflightBatching.cpp forwardSync sends the KV (respondAndSendAsync) only for a context-only request whose
# context finished without ending it; a finished one is terminated and its KV freed (docs/twin.md). TLLM_THROW's
# what() puts the file, line and perhaps a stack around the text: match the text as a substring, never the whole.
CONTEXT_PARAMS_MISSING = "contextParams must be present in the response"


def context_params_missing() -> str:
    """The backend's whole message for a context-only request that ended at its first token (the twin's words)."""
    return f"{_TRTLLM_FORMS[1]}{CONTEXT_PARAMS_MISSING}"


def ended_in_context(message: str) -> bool:
    """Whether a context-only request's error says the request finished at its first token (nothing to decode, no
    KV kept) rather than failed: the backend's contextParams words anywhere in it (Triton may prefix them)."""
    return CONTEXT_PARAMS_MISSING in message


def untagged_kind(message: str) -> str | None:
    """The kind of an untagged error whose words say where it came from: "internal" for TensorRT-LLM's backend
    (its forms above, wherever they appear: Triton prefixes the ensemble's name); None when the words say
    nothing (the caller decides: an error from Triton itself, a model gone or a stub that died)."""
    return "internal" if any(form in message for form in _TRTLLM_FORMS) else None
