"""Turn a role model's Triton request (tensors + parameters) into an EngineRequest. Pure: the Triton
shell passes a getter for its input tensors, so this is tested without a server.

Every refusal names the request and the field. Token ids are checked against the vocabulary by the
engine (`check_tokens`), which knows it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np

from trtpd.engine.request import EngineRequest, RequestError, RequestType
from trtpd.engine.sampler import SamplingParams, sampling_problems

GetInput = Callable[[str], "np.ndarray | None"]
INT32_MAX = 2**31 - 1


def _scalar(get: GetInput, name: str, default=None):
    value = get(name)
    if value is None:
        return default
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise RequestError(f"input {name!r} must hold one value per request, got shape {np.asarray(value).shape}")
    return flat[0].item()


def _int(get: GetInput, name: str, default=None):
    value = _scalar(get, name, default)
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    raise RequestError(f"input {name!r} must be an integer, got {value!r}")


def error_kind(exc: Exception) -> str:
    """Who is at fault, as an ERROR_CODES kind: the client (invalid_arg) or the server (internal, unavailable).
    A KV layout mismatch is the deployment's fault; an expired handle or a failed pull a server-side delay;
    a malformed or forged handle came from the caller."""
    from trtpd.kv.errors import KvHandleError, KvHandleExpiredError, KvLayoutMismatchError, KvTransferError

    if isinstance(exc, RequestError):
        return exc.kind
    if isinstance(exc, KvLayoutMismatchError):
        return "internal"
    if isinstance(exc, KvHandleExpiredError):
        return "unavailable"
    if isinstance(exc, KvHandleError):
        return "invalid_arg"
    if isinstance(exc, KvTransferError):
        return "unavailable"
    return "invalid_arg" if isinstance(exc, ValueError) else "internal"


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


def parse_word_list(value: "np.ndarray | None", name: str) -> list[list[int]]:
    """TensorRT-LLM's stop_words_list/bad_words_list: [2, N] (or [1, 2, N]); row 0 the token ids of all
    words back to back, row 1 each word's end offset, padded with -1."""
    if value is None:
        return []
    arr = np.asarray(value)
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 2 or arr.shape[0] != 2:
        raise RequestError(f"input {name!r} must have shape [2, N] (token ids, end offsets), got {list(arr.shape)}")
    ids, offsets = [int(t) for t in arr[0]], [int(o) for o in arr[1] if o >= 0]
    words, start = [], 0
    for end in offsets:
        if not start <= end <= len(ids):
            raise RequestError(f"input {name!r}: offsets {offsets} are not increasing ends within {len(ids)} ids")
        if end > start:
            words.append(ids[start:end])
        start = end
    return words


# TensorRT-LLM sampling inputs the reference engine does not implement: accepted at their neutral values (what
# TensorRT-LLM does without them), refused otherwise, so no request is silently sampled differently
ROLE_NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def unsupported_sampling(get: GetInput) -> list[str]:
    problems = []
    for name, neutral in ROLE_NEUTRAL.items():
        value = _scalar(get, name, neutral)
        if float(value) != neutral:
            problems.append(f"{name}={float(value):g} is not supported by the reference backend (only {neutral:g})")
    bias = get("embedding_bias")
    if bias is not None and np.any(np.asarray(bias) != 0):
        problems.append("embedding_bias with non-zero entries is not supported by the reference backend")
    return problems   # len_penalty (beam search only; one beam here) and pad_id change nothing: accepted


def parse_sampling(get: GetInput, request_id: str) -> SamplingParams:
    unsupported = unsupported_sampling(get)
    if unsupported:
        raise RequestError(f"request {request_id}: {'; '.join(unsupported)}")
    temperature = float(_scalar(get, "temperature", 0.0))
    top_k, top_p = _int(get, "runtime_top_k", 0), float(_scalar(get, "runtime_top_p", 1.0))
    seed = _int(get, "seed", 0)
    problems = sampling_problems(temperature, top_k, top_p, seed)
    if problems:
        raise RequestError(f"request {request_id}: {'; '.join(problems)}")
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


def _lengths(get: GetInput, request_id: str, prompt: list[int], has_ids: bool) -> tuple[int, int]:
    length = _int(get, "input_lengths")
    if length is None:
        raise RequestError(f"request {request_id}: missing required input input_lengths")
    if has_ids and length != len(prompt):
        raise RequestError(f"request {request_id}: input_lengths is {length} but input_ids has {len(prompt)} tokens")
    max_new = _int(get, "request_output_len")
    if max_new is None:
        raise RequestError(f"request {request_id}: missing required input request_output_len")
    if not 1 <= max_new <= INT32_MAX:
        raise RequestError(f"request {request_id}: request_output_len must be >= 1, got {max_new}")
    return length, max_new


def _single_beam(get: GetInput, request_id: str) -> None:
    beam_width = _int(get, "beam_width", 1)
    if beam_width != 1:
        raise RequestError(f"request {request_id}: beam_width must be 1 (this engine has max_beam_width 1, "
                           f"and disaggregated serving supports beam width 1 only), got {beam_width}")


def parse_request(get: GetInput, parameters: dict, request_id: str, arrival_s: float) -> EngineRequest:
    input_ids = get("input_ids")
    prompt = [] if input_ids is None else [int(t) for t in np.asarray(input_ids).reshape(-1)]
    _, max_new = _lengths(get, request_id, prompt, input_ids is not None)
    _single_beam(get, request_id)
    end_id = _int(get, "end_id")
    min_tokens = _int(get, "min_tokens", 0)
    if min_tokens < 0:
        raise RequestError(f"request {request_id}: min_tokens must be >= 0, got {min_tokens}")
    blob = get("context_phase_params")
    return EngineRequest(
        request_id=request_id, prompt_token_ids=prompt, max_new_tokens=max_new,
        request_type=parse_request_type(parameters), sampling=parse_sampling(get, request_id),
        end_id=None if end_id is None or end_id < 0 else end_id,
        streaming=bool(_scalar(get, "streaming", False)),
        context_phase_params=None if blob is None else np.asarray(blob, dtype=np.uint8).reshape(-1).tobytes(),
        arrival_s=arrival_s, layerwise_kv_transfer=_flag(parameters, "layerwise_kv_transfer"),
        stop_words=parse_word_list(get("stop_words_list"), "stop_words_list"),
        bad_words=parse_word_list(get("bad_words_list"), "bad_words_list"), min_tokens=min_tokens,
        return_generation_logits=bool(_scalar(get, "return_generation_logits", False)))


def _flag(parameters: dict, name: str) -> bool:
    value = parameters.get(name, False)
    if isinstance(value, str):
        return value.lower() in ("1", "true", "yes")
    return bool(value)


# ---- the ensemble's entry (preprocessing): client-facing names, TensorRT-LLM's ensemble inputs ----------

# accepted only at their neutral value: the reference engine and the orchestrator do not implement them
NEUTRAL = {"beam_width": 1, "length_penalty": 1.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0, "return_log_probs": False, "return_context_logits": False,
           "return_generation_logits": False, "exclude_input_in_output": True}
SUPPORTED = ("text_input, max_tokens, stream, end_id, pad_id, temperature, top_k, top_p, random_seed (or seed), "
             "min_length, stop_words, bad_words")


def refuse_parameters(parameters: dict, who: str) -> None:
    """Over HTTP generate, Triton turns JSON keys that are no input into request parameters: refuse them
    (gRPC refuses unknown inputs itself), so a misspelt or unsupported field is never silently ignored."""
    if parameters:
        names = ", ".join(sorted(parameters))
        raise RequestError(f"{who}: unknown or unsupported field(s) {names}; this ensemble takes {SUPPORTED} "
                           f"(and {', '.join(NEUTRAL)} at their default values only)")


def _neutral(get: GetInput, who: str) -> None:
    for name, neutral in NEUTRAL.items():
        value = _scalar(get, name)
        if value is not None and value != neutral:
            raise RequestError(f"{who}: {name}={value!r} is not supported (only {neutral!r}); leave it out")


def _words(get: GetInput, name: str, tokenizer, who: str) -> np.ndarray:
    """TensorRT-LLM's word-list tensor [1, 2, N] from a list of strings (ids back to back, end offsets)."""
    value = get(name)
    texts = [] if value is None else [t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t)
                                      for t in np.asarray(value).reshape(-1)]
    ids, offsets = [], []
    for text in (t for t in texts if t):
        word = tokenizer.encode(text, add_bos=False)
        if not word:
            raise RequestError(f"{who}: {name} entry {text!r} has no tokens")
        ids += word
        offsets.append(len(ids))
    width = max(1, len(ids))
    out = np.full((1, 2, width), -1, dtype=np.int32)
    out[0, 0, :] = 0
    out[0, 0, :len(ids)], out[0, 1, :len(offsets)] = ids, offsets
    return out


def _token_id(get: GetInput, name: str, vocab_size: int, who: str, default: int = -1) -> int:
    value = _int(get, name, default)
    if not -1 <= value < vocab_size:
        raise RequestError(f"{who}: {name} must be a token id in [0, {vocab_size}) or -1 (none), got {value}")
    return value


def _seed(get: GetInput, who: str) -> int:
    seed, random_seed = _int(get, "seed"), _int(get, "random_seed")
    if seed is not None and random_seed is not None and seed != random_seed:
        raise RequestError(f"{who}: seed ({seed}) and random_seed ({random_seed}) differ; send one of them")
    return random_seed if random_seed is not None else seed or 0


def parse_entry(get: GetInput, tokenizer, who: str) -> dict[str, np.ndarray]:
    """Validates the client's sampling fields (named as the client sent them) and returns the role-model
    tensors the orchestrator forwards, defaults filled in."""
    vocab = tokenizer.vocab_size
    _neutral(get, who)
    temperature = float(_scalar(get, "temperature", 0.0))
    top_k, top_p, seed = _int(get, "top_k", 0), float(_scalar(get, "top_p", 1.0)), _seed(get, who)
    problems = sampling_problems(temperature, top_k, top_p, seed, ("temperature", "top_k", "top_p", "random_seed"),
                                 vocab_size=vocab)
    if problems:
        raise RequestError(f"{who}: {'; '.join(problems)}")
    min_length = _int(get, "min_length", 0)
    if min_length < 0:
        raise RequestError(f"{who}: min_length must be >= 0, got {min_length}")
    _token_id(get, "pad_id", vocab, who)
    one = lambda v, dt: np.array([[v]], dtype=dt)   # noqa: E731
    # no end_id from the client: the tokenizer's EOS, as upstream's preprocessing fills it in (END_ID absent ->
    # self.tokenizer_end_id, triton_backend/all_models/inflight_batcher_llm/preprocessing/1/model.py); -1 is
    # the client saying "no end id" (TensorRT-LLM then stops only at the length or a stop word)
    return {"end_id": one(_token_id(get, "end_id", vocab, who, default=tokenizer.eos_id), np.int32),
            "temperature": one(temperature, np.float32), "runtime_top_k": one(top_k, np.int32),
            "runtime_top_p": one(top_p, np.float32), "seed": one(seed, np.uint64),
            "min_tokens": one(min_length, np.int32),
            "stop_words_list": _words(get, "stop_words", tokenizer, who),
            "bad_words_list": _words(get, "bad_words", tokenizer, who)}
