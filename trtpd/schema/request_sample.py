"""One finished request as the gateway keeps it for the controller (GET /admin/requests): the rollout gate's and
the live autoscaler's input. Seconds throughout; `t` is the unix time it ended (the controller windows by it).
The JSON of a sample is its fields, as they are; a field the reader does not know is an error, not ignored."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class RequestSample:
    t: float                              # unix seconds when it ended
    revision: int                         # the revision whose cohort served it
    ok: bool
    error_kind: str | None                # None when ok; "cancelled" (the client left), "invalid_arg", "unavailable",
                                          # "internal", "overloaded"
    ttft_s: float | None
    tpot_s: float | None                  # its mean inter-token time (None: fewer than two tokens)
    num_tokens: int
    num_prompt_tokens: int = 0
    prefill_queue_s: float | None = None  # the TTFT breakdown's queue parts, when the instances reported them
    decode_queue_s: float | None = None
    itl_p50_s: float | None = None        # its inter-token gaps (reported; no decision uses them: TPOT judges)
    itl_p90_s: float | None = None
    itl_max_s: float | None = None
    prefill_instance: str = ""
    decode_instance: str = ""             # or the colocated instance

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RequestSample":
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"request sample: unknown field(s) {sorted(unknown)}")
        return cls(**data)
