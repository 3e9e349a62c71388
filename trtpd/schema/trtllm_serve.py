"""trtllm-serve's OpenAI protocol, the part trtpd speaks and its twin serves (TensorRT-LLM 1.2.1). Pure.

Sources (docs/serve-twin.md has the table; 1.2.1's own files are not in the stored index, so each was read at
main-branch versions from before and after the release/1.2 cut, and kept where the two agree):
- `tensorrt_llm/serve/openai_protocol.py`: every model is `OpenAIBaseModel` with `extra="forbid"` (an unknown
  field is a 400); `DisaggregatedParams` {request_type (required), first_gen_tokens, ctx_request_id,
  encoded_opaque_state (base64 of the engine's opaque state), draft_tokens}; `CompletionRequest` carries
  `disaggregated_params` and `detokenize` (false: a choice carries `token_ids` instead of text); a context_only
  `CompletionResponse` carries `prompt_token_ids` and each choice its `disaggregated_params`; `ErrorResponse`
  {object "error", message, type, param, code}, flat.
- `tensorrt_llm/executor/result.py`: finish reasons; a context-only request that did not finish says
  "not_finished", and upstream's router goes on to a generation server only after "length" or "not_finished"
  (`openai_disagg_service.py` `_need_gen`).
- cluster registration (`tensorrt_llm/serve/cluster_storage.py`, `disagg_auto_scaling.py`): keys
  `/trtllm-disagg/<cluster_name>/workers/<worker_id>`, values the JSON of `WorkerInfo` {worker_id, host, port,
  role} with role 0 CONTEXT, 1 GENERATION (`ServerRole`).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, dataclass

CONTEXT_ONLY = "context_only"
GENERATION_ONLY = "generation_only"
CONTEXT_AND_GENERATION = "context_and_generation"
REQUEST_TYPES = (CONTEXT_ONLY, GENERATION_ONLY, CONTEXT_AND_GENERATION)
GO_ON_TO_GENERATION = ("length", "not_finished")      # _need_gen: other context finish reasons end the request
SERVER_ROLES = {"CONTEXT": 0, "GENERATION": 1}         # ServerRole (tensorrt_llm/llmapi/disagg_utils.py)
CLUSTER_KEY_PREFIX = "/trtllm-disagg"
# the twin's own: the orchestrator's proof (trtpd/kv/auth.py) on a request to a twin that holds the deployment key;
# a real trtllm-serve 1.2.1 has no request authentication and ignores the header
AUTH_HEADER = "x-trtpd-auth"


class ProtocolError(ValueError):
    """A message that does not follow trtllm-serve's protocol (the field is named)."""


@dataclass(frozen=True)
class DisaggregatedParams:
    request_type: str
    first_gen_tokens: list[int] | None = None
    ctx_request_id: int | None = None
    encoded_opaque_state: str | None = None
    draft_tokens: list[int] | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object, where: str = "disaggregated_params") -> "DisaggregatedParams":
        if not isinstance(data, dict):
            raise ProtocolError(f"{where} must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ProtocolError(f"{where}.{unknown[0]}: extra inputs are not permitted")
        request_type = data.get("request_type")
        if not isinstance(request_type, str) or request_type.lower() not in REQUEST_TYPES:
            raise ProtocolError(f"{where}.request_type must be one of {', '.join(REQUEST_TYPES)}, got {request_type!r}")
        for name in ("first_gen_tokens", "draft_tokens"):
            value = data.get(name)
            if value is not None and (not isinstance(value, list) or
                                      not all(isinstance(t, int) and not isinstance(t, bool) for t in value)):
                raise ProtocolError(f"{where}.{name} must be a list of token ids")
        ctx_id = data.get("ctx_request_id")
        if ctx_id is not None and (not isinstance(ctx_id, int) or isinstance(ctx_id, bool)):
            raise ProtocolError(f"{where}.ctx_request_id must be an integer")
        state = data.get("encoded_opaque_state")
        if state is not None and not isinstance(state, str):
            raise ProtocolError(f"{where}.encoded_opaque_state must be a base64 string")
        return cls(request_type.lower(), data.get("first_gen_tokens"), ctx_id, state, data.get("draft_tokens"))

    def opaque_state(self) -> bytes | None:
        """The engine's opaque state (base64-decoded, as `decode_opaque_state` does)."""
        if self.encoded_opaque_state is None:
            return None
        try:
            return base64.b64decode(self.encoded_opaque_state, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("disaggregated_params.encoded_opaque_state is not valid base64") from None

    def for_generation(self) -> "DisaggregatedParams":
        """What upstream's router sends the generation server: the context answer's, request_type changed."""
        return DisaggregatedParams(GENERATION_ONLY, self.first_gen_tokens, self.ctx_request_id,
                                   self.encoded_opaque_state, self.draft_tokens)


def encode_opaque_state(state: bytes) -> str:
    return base64.b64encode(state).decode("utf-8")


def error_body(message: str, code: int = 400, err_type: str = "BadRequestError") -> dict:
    """`create_error_response`'s body: flat, not wrapped in {"error": ...}."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def error_message(status: int, body: bytes) -> str:
    """The message of a worker's error answer, in whichever shape it came (ErrorResponse, {"error": ...} for a
    validation error after the release/1.2 cut, or the router's {"detail": ...})."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return f"HTTP {status}: {body[:200]!r}"
    if isinstance(data, dict):
        for key in ("message", "error", "detail"):
            if isinstance(data.get(key), str):
                return data[key]
            if isinstance(data.get(key), dict) and isinstance(data[key].get("message"), str):
                return data[key]["message"]
    return f"HTTP {status}: {str(data)[:200]}"


@dataclass(frozen=True)
class WorkerInfo:
    """A worker's registration value (disagg_auto_scaling.py WorkerInfo)."""

    worker_id: str
    host: str
    port: int
    role: int            # SERVER_ROLES

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "WorkerInfo":
        try:
            data = json.loads(text)
            info = cls(str(data["worker_id"]), str(data["host"]), int(data["port"]), int(data["role"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(f"not a worker registration ({type(exc).__name__}: {exc})") from None
        if info.role not in SERVER_ROLES.values() or not 0 < info.port < 65536:
            raise ProtocolError(f"worker {info.worker_id!r}: role {info.role} or port {info.port} out of range")
        return info

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def workers_prefix(cluster_name: str) -> str:
    return f"{CLUSTER_KEY_PREFIX}/{cluster_name}/workers"


# what trtpd's worker YAML sets perf_metrics_max_requests to: records kept between two reads (the gateway reads
# after each request finishes; a record is a few hundred bytes)
PERF_METRICS_MAX_REQUESTS = 4096


# ---- /perf_metrics (openai_server.py get_perf_metrics / _extract_metrics; llm_args.py return_perf_metrics,
# perf_metrics_max_requests): one record per finished request, handed out once. Times are the worker's steady clock
# in seconds plus the offset the router set (POST /steady_clock_offset); kv_cache_* only when KV was transferred.
@dataclass(frozen=True)
class RequestTimings:
    """A record's `timing_metrics` (RequestPerfMetrics.TimingMetrics), seconds."""

    arrival_time: float
    first_scheduled_time: float
    first_token_time: float
    last_token_time: float
    kv_cache_size: int = 0                       # bytes; 0: no KV transfer, the kv_cache_transfer_* are absent
    kv_cache_transfer_start: float | None = None
    kv_cache_transfer_end: float | None = None

    def to_dict(self, offset_s: float = 0.0, server_arrival_time: float | None = None,
                server_first_token_time: float | None = None) -> dict:
        out = {"server_arrival_time": None if server_arrival_time is None else server_arrival_time + offset_s,
               "arrival_time": self.arrival_time + offset_s,
               "first_scheduled_time": self.first_scheduled_time + offset_s,
               "first_token_time": self.first_token_time + offset_s,
               "server_first_token_time": None if server_first_token_time is None
               else server_first_token_time + offset_s,
               "last_token_time": self.last_token_time + offset_s}
        if self.kv_cache_size > 0:
            out.update(kv_cache_size=self.kv_cache_size, kv_cache_transfer_start=self.kv_cache_transfer_start + offset_s,
                       kv_cache_transfer_end=self.kv_cache_transfer_end + offset_s)
        return out


def perf_record(request_id: int, ctx_request_id: int | None, timings: RequestTimings, first_iter: int,
                last_iter: int, offset_s: float = 0.0, server_arrival_time: float | None = None,
                server_first_token_time: float | None = None, num_blocks: int = 0) -> dict:
    """One `/perf_metrics` entry as upstream writes it (ctx_request_id only for a disaggregated request)."""
    record = {"request_id": request_id, "perf_metrics": {
        "first_iter": first_iter, "last_iter": last_iter,
        "timing_metrics": timings.to_dict(offset_s, server_arrival_time, server_first_token_time),
        "kv_cache_metrics": {"num_total_allocated_blocks": num_blocks, "num_new_allocated_blocks": num_blocks,
                             "num_reused_blocks": 0, "num_missed_blocks": num_blocks}}}
    if ctx_request_id is not None:
        record["ctx_request_id"] = ctx_request_id
    return record


def read_perf_record(item: object) -> tuple[int, RequestTimings] | None:
    """(ctx_request_id, timings) of a `/perf_metrics` entry; None for one of a request that was not disaggregated,
    or one not in upstream's shape."""
    try:
        t = item["perf_metrics"]["timing_metrics"]
        ctx_request_id = item.get("ctx_request_id")
        if ctx_request_id is None:
            return None
        size = int(t.get("kv_cache_size") or 0)
        return int(ctx_request_id), RequestTimings(
            float(t["arrival_time"]), float(t["first_scheduled_time"]), float(t["first_token_time"]),
            float(t["last_token_time"]), size, float(t["kv_cache_transfer_start"]) if size else None,
            float(t["kv_cache_transfer_end"]) if size else None)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def context_phase_perf(t: RequestTimings) -> dict[str, float]:
    """A context server's record as trtpd's TTFT phases (trtpd/perf_outputs.py names): queued until first
    scheduled, then computing until its first token."""
    return {"prefill_queue_s": max(0.0, t.first_scheduled_time - t.arrival_time),
            "prefill_compute_s": max(0.0, t.first_token_time - t.first_scheduled_time)}


def generation_phase_perf(t: RequestTimings) -> dict[str, float]:
    """A generation server's record as trtpd's TTFT phases: queued until its KV transfer started (until first
    scheduled when it transferred none), the transfer, and the bytes moved."""
    if t.kv_cache_size <= 0 or t.kv_cache_transfer_start is None or t.kv_cache_transfer_end is None:
        return {"decode_queue_s": max(0.0, t.first_scheduled_time - t.arrival_time)}
    return {"decode_queue_s": max(0.0, t.kv_cache_transfer_start - t.arrival_time),
            "kv_transfer_s": max(0.0, t.kv_cache_transfer_end - t.kv_cache_transfer_start),
            "kv_transfer_bytes": float(t.kv_cache_size)}
