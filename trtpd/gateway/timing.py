"""Per-request timings as the client sees them: TTFT, inter-token gaps, TPOT, the worst stall."""

from __future__ import annotations

from dataclasses import dataclass, field

from trtpd.schema.slo import Slo


@dataclass
class RequestTiming:
    arrival_s: float
    token_times_s: list[float] = field(default_factory=list)

    def add_tokens(self, num_tokens: int, now_s: float) -> None:
        self.token_times_s += [now_s] * num_tokens

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.arrival_s if self.token_times_s else None

    @property
    def gaps_s(self) -> list[float]:
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot_s(self) -> float | None:
        n = len(self.token_times_s)
        return (self.token_times_s[-1] - self.token_times_s[0]) / (n - 1) if n > 1 else None

    @property
    def worst_stall_s(self) -> float:
        return max(self.gaps_s, default=0.0)

    def meets(self, slo: Slo) -> bool:
        """DistServe's goodput criterion: both the TTFT and the TPOT target met (a one-token answer has no TPOT)."""
        ttft, tpot = self.ttft_s, self.tpot_s
        return ttft is not None and ttft <= slo.ttft_s and (tpot is None or tpot <= slo.tpot_s)
