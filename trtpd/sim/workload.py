"""Workloads: an arrival process and input/output length distributions, or a trace to replay.

YAML (configs/workloads/*.yaml):

    name: chat
    arrival: {process: poisson}            # or {process: gamma, cv: 2.0}
    input_tokens: {kind: power_law, mean_tokens: 512, p99_tokens: 2048, max_tokens: 4096}
    output_tokens: {kind: fixed, tokens: 256}

or, to replay recorded traffic exactly (e.g. what the bench client sent to a real deployment):

    name: recorded
    trace: {path: run1.csv}                # columns arrival_s, input_tokens, output_tokens

or, for traffic whose rate and length mix change over time (seed 000 5.2's day and night), phases
played in order, each with its own rate and lengths (arrivals `arrival:` as above, restarted per phase):

    name: daynight
    phases:
      - {name: day, duration_s: 300, rate_per_s: 20, input_tokens: {...}, output_tokens: {...}}
      - {name: night, duration_s: 300, rate_per_s: 8, input_tokens: {...}, output_tokens: {...}}

Relative trace paths are resolved against the workload file's folder. The rate is not part of a
workload (it is the planner's target, or `--rate-per-s`), except for a replayed trace and for
phases; a rate given for a phased workload rescales every phase's rate by one factor so that the
time-averaged rate equals it (the day's shape is kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtpd.errors import ConfigError
from trtpd.perf.yaml_io import config_path, load_model, read_yaml
from trtpd.resources import configs_dir
from trtpd.sim.lengths import (STATS_SAMPLES, LengthDistribution, LengthStats, TraceLengths, read_trace_column,
                               stats_of)

WORKLOAD_DIR = configs_dir("workloads")


class ArrivalSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    process: Literal["poisson", "gamma"] = "poisson"
    cv: float = Field(default=1.0, gt=0, description="gamma: coefficient of variation of inter-arrival times")


class TraceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: Path
    arrival_column: str = "arrival_s"
    input_column: str = "input_tokens"
    output_column: str = "output_tokens"


class PhaseSpec(BaseModel):
    """One stretch of a time-varying workload: its length, rate and length distributions."""

    model_config = ConfigDict(extra="forbid")
    name: str
    duration_s: float = Field(gt=0)
    rate_per_s: float = Field(gt=0)
    input_tokens: LengthDistribution
    output_tokens: LengthDistribution

    @property
    def expected_requests(self) -> float:
        return self.rate_per_s * self.duration_s


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "workload"
    arrival: ArrivalSpec = Field(default_factory=ArrivalSpec)
    input_tokens: LengthDistribution | None = None
    output_tokens: LengthDistribution | None = None
    trace: TraceSpec | None = None
    phases: list[PhaseSpec] | None = None

    @model_validator(mode="after")
    def _check(self) -> "WorkloadSpec":
        if self.phases is not None:
            if not self.phases:
                raise ValueError("phases: give at least one phase")
            if self.trace is not None or self.input_tokens is not None or self.output_tokens is not None:
                raise ValueError("a phased workload gives input_tokens and output_tokens per phase, and no trace")
            return self
        if self.trace is None and (self.input_tokens is None or self.output_tokens is None):
            raise ValueError("give input_tokens and output_tokens, a trace to replay, or phases")
        return self

    @property
    def duration_s(self) -> float | None:
        """One pass over the phases; None for a workload without phases."""
        return sum(p.duration_s for p in self.phases) if self.phases else None

    @property
    def mean_rate_per_s(self) -> float | None:
        """The phases' time-averaged rate; None for a workload without phases."""
        if not self.phases:
            return None
        return sum(p.expected_requests for p in self.phases) / sum(p.duration_s for p in self.phases)

    def phase_at(self, time_s: float) -> PhaseSpec | None:
        """The phase running at time_s (from the first arrival's phase start, 0); None past the end."""
        start = 0.0
        for phase in self.phases or ():
            if time_s < start + phase.duration_s:
                return phase
            start += phase.duration_s
        return None

    def input_stats(self) -> LengthStats:
        return self._stats("input")

    def output_stats(self) -> LengthStats:
        return self._stats("output")

    def _stats(self, which: str) -> LengthStats:
        if self.phases:
            return _mixture_stats(self.phases, which)
        dist = self.input_tokens if which == "input" else self.output_tokens
        if dist is None:
            assert self.trace is not None
            column = self.trace.input_column if which == "input" else self.trace.output_column
            dist = TraceLengths(kind="trace", path=self.trace.path, column=column)
        return dist.stats()

    @property
    def arrival_cv(self) -> float:
        return self.arrival.cv if self.arrival.process == "gamma" else 1.0


@dataclass(frozen=True)
class RequestArrays:
    """The simulator's input: one entry per request, sorted by arrival."""

    arrival_s: list[float]
    input_tokens: list[int]
    output_tokens: list[int]

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return self.arrival_s[-1] - self.arrival_s[0] if self.arrival_s else 0.0


def interarrivals_s(arrival: ArrivalSpec, rate_per_s: float, n: int, rng: np.random.Generator) -> np.ndarray:
    if rate_per_s <= 0:
        raise ConfigError(f"rate must be positive, got {rate_per_s} requests/s")
    if arrival.process == "poisson":
        return rng.exponential(1.0 / rate_per_s, size=n)
    shape = 1.0 / (arrival.cv * arrival.cv)
    return rng.gamma(shape, 1.0 / (rate_per_s * shape), size=n)


def _mixture_stats(phases: list[PhaseSpec], which: str) -> LengthStats:
    """The lengths over a whole pass: each phase sampled in proportion to its expected requests."""
    rng = np.random.default_rng(12345)
    total = sum(p.expected_requests for p in phases)
    parts = []
    for phase in phases:
        dist = phase.input_tokens if which == "input" else phase.output_tokens
        parts.append(dist.sample(rng, max(1, round(STATS_SAMPLES * phase.expected_requests / total))))
    return stats_of(np.concatenate(parts))


def generate_requests(spec: WorkloadSpec, rate_per_s: float | None, num_requests: int | None,
                      seed: int = 0) -> RequestArrays:
    """num_requests: how many (required, except for a trace or phases, where it caps the count)."""
    if spec.trace is not None:
        return replay_trace(spec.trace, num_requests)
    if spec.phases:
        return generate_phased(spec, rate_per_s, num_requests, seed)
    if num_requests is None:
        raise ConfigError(f"workload {spec.name!r}: give a number of requests")
    if rate_per_s is None:
        raise ConfigError(f"workload {spec.name!r}: give a rate (requests/s); only a trace carries its own")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(interarrivals_s(spec.arrival, rate_per_s, num_requests, rng))
    assert spec.input_tokens is not None and spec.output_tokens is not None
    inputs = spec.input_tokens.sample(rng, num_requests)
    outputs = spec.output_tokens.sample(rng, num_requests)
    return RequestArrays(arrivals.tolist(), inputs.tolist(), outputs.tolist())


def generate_phased(spec: WorkloadSpec, rate_per_s: float | None, num_requests: int | None,
                    seed: int = 0) -> RequestArrays:
    """One pass over the phases, each generated with its own random stream (seed, phase number), so
    a phase's requests do not depend on the phases before it; capped at num_requests."""
    assert spec.phases
    scale = 1.0 if rate_per_s is None else rate_per_s / spec.mean_rate_per_s
    arrivals: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    start_s = 0.0
    for i, phase in enumerate(spec.phases):
        rng = np.random.default_rng([seed, i])
        times = _arrivals_within(spec.arrival, phase.rate_per_s * scale, phase.duration_s, rng)
        arrivals += (start_s + times).tolist()
        inputs += phase.input_tokens.sample(rng, len(times)).tolist()
        outputs += phase.output_tokens.sample(rng, len(times)).tolist()
        start_s += phase.duration_s
        if num_requests is not None and len(arrivals) >= num_requests:
            break
    n = len(arrivals) if num_requests is None else min(num_requests, len(arrivals))
    return RequestArrays(arrivals[:n], inputs[:n], outputs[:n])


def _arrivals_within(arrival: ArrivalSpec, rate_per_s: float, duration_s: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, duration_s) of a renewal process at rate_per_s."""
    expected = rate_per_s * duration_s
    chunk = int(expected + 5 * expected ** 0.5) + 10
    times = np.cumsum(interarrivals_s(arrival, rate_per_s, chunk, rng))
    while times[-1] < duration_s:
        more = np.cumsum(interarrivals_s(arrival, rate_per_s, chunk, rng)) + times[-1]
        times = np.concatenate([times, more])
    return times[times < duration_s]


def replay_trace(trace: TraceSpec, num_requests: int | None = None) -> RequestArrays:
    arrivals = read_trace_column(trace.path, trace.arrival_column)
    inputs = [max(1, int(v)) for v in read_trace_column(trace.path, trace.input_column)]
    outputs = [max(1, int(v)) for v in read_trace_column(trace.path, trace.output_column)]
    order = sorted(range(len(arrivals)), key=arrivals.__getitem__)[:num_requests]
    return RequestArrays([arrivals[i] for i in order], [inputs[i] for i in order], [outputs[i] for i in order])


def workload_path(name_or_path: str) -> Path:
    return config_path("workload", name_or_path, WORKLOAD_DIR)


def load_workload(name_or_path: str) -> WorkloadSpec:
    path = workload_path(name_or_path)
    data = read_yaml(path)
    spec = load_model(WorkloadSpec, data, str(path))
    return _resolve_paths(spec, path.parent)


def _resolve_paths(spec, base: Path):
    """A WorkloadSpec or PhaseSpec with its relative trace paths resolved against base."""
    def fix(p: Path) -> Path:
        return p if p.is_absolute() else base / p
    updates: dict = {}
    if getattr(spec, "trace", None) is not None:
        updates["trace"] = spec.trace.model_copy(update={"path": fix(spec.trace.path)})
    for key in ("input_tokens", "output_tokens"):
        dist = getattr(spec, key)
        if isinstance(dist, TraceLengths):
            updates[key] = dist.model_copy(update={"path": fix(dist.path)})
    if getattr(spec, "phases", None):
        updates["phases"] = [_resolve_paths(p, base) for p in spec.phases]
    return spec.model_copy(update=updates)
