"""Prefill batching policy (seed 000 section 3.2).

Waiting requests are grouped into buckets by input length, so a batch holds prompts of similar
length. A bucket is dispatched when it holds `min_batch_size` requests, when it holds enough tokens
to fill `max_num_tokens`, or when its oldest request has waited `bucket_timeout_s` (5 ms by
default). When traffic is sparse and the dispatched bucket cannot fill a minimum batch, the batch is
filled from neighbouring buckets (cross-bucket fill), nearest lengths first. Batches never exceed
`max_batch_size` requests or `max_num_tokens` prompt tokens (prompts are packed without padding,
like TensorRT-LLM's remove_input_padding).

Pure: time is a parameter; the engine and the simulator call the same code.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrefillSchedulerConfig:
    bucket_boundaries_tokens: tuple[int, ...] = (64, 256, 512, 1024, 2048)
    bucket_timeout_s: float = 0.005
    min_batch_size: int = 2
    max_batch_size: int = 8
    max_num_tokens: int = 8192

    def __post_init__(self) -> None:
        if list(self.bucket_boundaries_tokens) != sorted(set(self.bucket_boundaries_tokens)):
            raise ValueError(f"bucket_boundaries_tokens must be strictly increasing, got {self.bucket_boundaries_tokens}")
        if self.bucket_timeout_s < 0:
            raise ValueError(f"bucket_timeout_s must be >= 0, got {self.bucket_timeout_s}")
        if not 1 <= self.min_batch_size <= self.max_batch_size:
            raise ValueError(f"need 1 <= min_batch_size ({self.min_batch_size}) <= max_batch_size ({self.max_batch_size})")
        if self.max_num_tokens <= 0:
            raise ValueError(f"max_num_tokens must be positive, got {self.max_num_tokens}")


@dataclass(frozen=True)
class PrefillRequest:
    request_id: str
    num_tokens: int
    arrival_s: float


@dataclass(frozen=True)
class PrefillBatch:
    requests: tuple[PrefillRequest, ...]
    reason: str  # "full_bucket" | "full_tokens" | "timeout" | "cross_bucket_fill"

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.requests]


@dataclass
class _Bucket:
    requests: deque = field(default_factory=deque)
    num_tokens: int = 0


class PrefillScheduler:
    def __init__(self, config: PrefillSchedulerConfig) -> None:
        self.config = config
        self.buckets = [_Bucket() for _ in range(len(config.bucket_boundaries_tokens) + 1)]

    @property
    def num_waiting(self) -> int:
        return sum(len(b.requests) for b in self.buckets)

    @property
    def num_waiting_tokens(self) -> int:
        return sum(b.num_tokens for b in self.buckets)

    def bucket_index(self, num_tokens: int) -> int:
        return bisect.bisect_left(self.config.bucket_boundaries_tokens, num_tokens)

    def add(self, request: PrefillRequest) -> None:
        if request.num_tokens > self.config.max_num_tokens:
            raise ValueError(f"request {request.request_id}: {request.num_tokens} prompt tokens exceed "
                             f"max_num_tokens {self.config.max_num_tokens}; it can never be scheduled")
        bucket = self.buckets[self.bucket_index(request.num_tokens)]
        bucket.requests.append(request)
        bucket.num_tokens += request.num_tokens

    def remove(self, request_id: str) -> bool:
        """Drops a waiting request (cancelled). Returns whether it was waiting."""
        for bucket in self.buckets:
            for req in bucket.requests:
                if req.request_id == request_id:
                    bucket.requests.remove(req)
                    bucket.num_tokens -= req.num_tokens
                    return True
        return False

    def next_deadline_s(self) -> float | None:
        """The earliest time at which a bucket times out, or None if nothing waits."""
        heads = [b.requests[0].arrival_s for b in self.buckets if b.requests]
        return min(heads) + self.config.bucket_timeout_s if heads else None

    def _ready_reason(self, bucket: _Bucket, now_s: float) -> str | None:
        if not bucket.requests:
            return None
        if len(bucket.requests) >= self.config.min_batch_size:
            return "full_bucket"
        if bucket.num_tokens >= self.config.max_num_tokens:
            return "full_tokens"
        if now_s - bucket.requests[0].arrival_s >= self.config.bucket_timeout_s:
            return "timeout"
        return None

    def schedule(self, now_s: float, max_tokens_available: int | None = None) -> PrefillBatch | None:
        """Returns the next batch, or None when no bucket is ready yet.

        `max_tokens_available` lets the caller bound the batch by free KV capacity (in tokens).
        """
        ready = [(b.requests[0].arrival_s, i, reason) for i, b in enumerate(self.buckets)
                 if (reason := self._ready_reason(b, now_s))]
        if not ready:
            return None
        _, index, reason = min(ready)
        token_budget = self.config.max_num_tokens
        if max_tokens_available is not None:
            token_budget = min(token_budget, max_tokens_available)
        chosen = self._take(index, self.config.max_batch_size, token_budget)
        if not chosen:
            return None
        if len(chosen) < self.config.min_batch_size:
            used = sum(r.num_tokens for r in chosen)
            for other in self._neighbours(index):
                room = self.config.max_batch_size - len(chosen)
                if room <= 0:
                    break
                extra = self._take(other, room, token_budget - used)
                if extra:
                    reason = "cross_bucket_fill"
                    chosen.extend(extra)
                    used += sum(r.num_tokens for r in extra)
        return PrefillBatch(tuple(chosen), reason)

    def _neighbours(self, index: int) -> list[int]:
        order = sorted(range(len(self.buckets)), key=lambda i: (abs(i - index), i))
        return [i for i in order if i != index]

    def _take(self, index: int, max_requests: int, token_budget: int) -> list[PrefillRequest]:
        bucket = self.buckets[index]
        taken: list[PrefillRequest] = []
        used = 0
        while bucket.requests and len(taken) < max_requests:
            head = bucket.requests[0]
            if used + head.num_tokens > token_budget:
                break
            bucket.requests.popleft()
            bucket.num_tokens -= head.num_tokens
            taken.append(head)
            used += head.num_tokens
        return taken
