"""What to do when one step of a request fails: a pure decision from the stage, the error kind and
the attempt number (bounded retries, never for the client's own errors)."""

from __future__ import annotations

from dataclasses import dataclass

STAGES = ("prefill", "kv_pull", "decode")
ERROR_KINDS = ("unavailable", "internal", "invalid_arg")

_STAGE_TEXT = {
    "prefill": "prefill",
    "kv_pull": "KV pull from prefill",
    "decode": "decode (before the first token)",
}
_CAUSE_TEXT = {
    "unavailable": "instance unavailable",
    "internal": "internal error",
    "invalid_arg": "invalid argument",
}


@dataclass(frozen=True)
class FailureDecision:
    action: str                 # "retry_prefill" | "retry_decode" | "fail"
    exclude: frozenset[str]     # instances not to use for this request's next attempt
    message: str                # for the client when action == "fail" (names the stage and the cause)
    error_kind: str             # "unavailable" | "internal" | "invalid_arg" (how the gateway answers: 503/500/400)


def check_failure(stage: str, error_kind: str) -> None:
    if stage not in STAGES:
        raise ValueError(f"unknown failure stage {stage!r}; expected one of {', '.join(STAGES)}")
    if error_kind not in ERROR_KINDS:
        raise ValueError(f"unknown error kind {error_kind!r}; expected one of {', '.join(ERROR_KINDS)}")


def retry_action(stage: str) -> str:
    """A failed prefill or KV pull is retried by prefilling again elsewhere; a failed decode by decoding elsewhere."""
    return "retry_decode" if stage == "decode" else "retry_prefill"


def describe(stage: str, error_kind: str, failed_instance: str) -> str:
    where = f"{_STAGE_TEXT[stage]} on {failed_instance}" if stage != "kv_pull" else \
        f"{_STAGE_TEXT[stage]} instance {failed_instance}"
    return f"{where} failed: {_CAUSE_TEXT[error_kind]}"


def decide_failure(stage: str, error_kind: str, attempt: int, max_attempts: int, failed_instance: str,
                   excluded_before: frozenset[str]) -> FailureDecision:
    """Retry while attempt < max_attempts, excluding every instance that failed this request so far;
    invalid_arg (the client's fault) fails at once. `attempt` is 1-based: the failed try's number."""
    check_failure(stage, error_kind)
    exclude = excluded_before | {failed_instance}
    what = describe(stage, error_kind, failed_instance)
    if error_kind == "invalid_arg":
        return FailureDecision("fail", exclude, f"{what} (not retried: the request is at fault)", error_kind)
    if attempt < max_attempts:
        return FailureDecision(retry_action(stage), exclude, f"{what}; retrying, attempt {attempt + 1} of "
                                                              f"{max_attempts}", error_kind)
    return FailureDecision("fail", exclude, f"{what} (attempt {attempt} of {max_attempts})", error_kind)


def no_alternative(decision: FailureDecision, stage: str, error_kind: str, failed_instance: str) -> FailureDecision:
    """A retry with nowhere to go fails now (503: capacity, not the request, is missing)."""
    role = "decode" if stage == "decode" else "prefill"
    return FailureDecision("fail", decision.exclude, f"{describe(stage, error_kind, failed_instance)}; "
                                                     f"no other {role} instance is available", "unavailable")
