"""Workloads: an arrival process and input/output length distributions, or a trace to replay.

YAML (configs/workloads/*.yaml):

    name: chat
    arrival: {process: poisson}            # or {process: gamma, cv: 2.0}
    input_tokens: {kind: power_law, mean_tokens: 512, p99_tokens: 2048, max_tokens: 4096}
    output_tokens: {kind: fixed, tokens: 256}

or, to replay recorded traffic exactly (e.g. what the bench client sent to a real deployment):

    name: recorded
    trace: {path: run1.csv}                # columns arrival_s, input_tokens, output_tokens

Relative trace paths are resolved against the workload file's folder. The rate is not part of a
workload (it is the planner's target, or `--rate-per-s`), except for a replayed trace.
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
from trtpd.sim.lengths import LengthDistribution, LengthStats, TraceLengths, read_trace_column

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


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "workload"
    arrival: ArrivalSpec = Field(default_factory=ArrivalSpec)
    input_tokens: LengthDistribution | None = None
    output_tokens: LengthDistribution | None = None
    trace: TraceSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> "WorkloadSpec":
        if self.trace is None and (self.input_tokens is None or self.output_tokens is None):
            raise ValueError("give input_tokens and output_tokens, or a trace to replay")
        return self

    def input_stats(self) -> LengthStats:
        return self._stats("input")

    def output_stats(self) -> LengthStats:
        return self._stats("output")

    def _stats(self, which: str) -> LengthStats:
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


def generate_requests(spec: WorkloadSpec, rate_per_s: float | None, num_requests: int, seed: int = 0) -> RequestArrays:
    if spec.trace is not None:
        return replay_trace(spec.trace, num_requests)
    if rate_per_s is None:
        raise ConfigError(f"workload {spec.name!r}: give a rate (requests/s); only a trace carries its own")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(interarrivals_s(spec.arrival, rate_per_s, num_requests, rng))
    assert spec.input_tokens is not None and spec.output_tokens is not None
    inputs = spec.input_tokens.sample(rng, num_requests)
    outputs = spec.output_tokens.sample(rng, num_requests)
    return RequestArrays(arrivals.tolist(), inputs.tolist(), outputs.tolist())


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


def _resolve_paths(spec: WorkloadSpec, base: Path) -> WorkloadSpec:
    def fix(p: Path) -> Path:
        return p if p.is_absolute() else base / p
    updates = {}
    if spec.trace is not None:
        updates["trace"] = spec.trace.model_copy(update={"path": fix(spec.trace.path)})
    for key in ("input_tokens", "output_tokens"):
        dist = getattr(spec, key)
        if isinstance(dist, TraceLengths):
            updates[key] = dist.model_copy(update={"path": fix(dist.path)})
    return spec.model_copy(update=updates)
