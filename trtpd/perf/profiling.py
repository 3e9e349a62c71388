"""Measuring an engine's curves into a MeasuredProfile (the core of `trtpd profile`).

The measuring functions are parameters (the reference engine's, or fakes in tests), so this module
does no I/O itself. Prefill: latency vs batched prompt tokens; a point of T tokens is a batch of
ceil(T / max_prompt_tokens) equal short prompts, and one prompt of each of `single_prompt_tokens` gives what a
long prompt's attention adds (MeasuredPerfModel.prefill_s). Decode: step latency over a grid of batch sizes x
context lengths. Points the engine cannot run (beyond its max_num_tokens, max_input_len, max_batch_size,
max_seq_len or KV pool) are left out, keeping the grid rectangular.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from trtpd.errors import ConfigError
from trtpd.perf.measured import DecodeGrid, MeasuredProfile, PrefillCurve

MeasurePrefill = Callable[[list[int]], float]          # prompt lengths of one batch -> seconds
MeasureDecode = Callable[[int, int], float]            # (batch size, context tokens per sequence) -> seconds
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ProfileGrid:
    prefill_num_tokens: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
    # short enough that the curve is the tokens' cost with little attention (before 2026-12-04: 1024, which made
    # the curve's points up to 1,024 one prompt and beyond it several, and read a batch of short prompts as one)
    max_prompt_tokens: int = 64
    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    decode_context_lens: tuple[int, ...] = (64, 256, 1024)
    # one prompt's cost has a knee between 768 and 896 tokens on the reference engine (2026-12-05, in-process: 768
    # 181-214 ms, 832 236-314, 896 350-360, 1024 416-418): 768 and 1024 alone interpolated 896 at 310 ms
    single_prompt_tokens: tuple[int, ...] = (128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 2048, 3072, 4096)

    @classmethod
    def quick(cls) -> "ProfileGrid":
        return cls((64, 256, 1024, 2048), 64, (1, 4, 16), (64, 512), (256, 1024))


@dataclass(frozen=True)
class EngineLimits:
    prefill_max_num_tokens: int
    decode_max_batch_size: int
    decode_max_seq_len: int
    decode_kv_capacity_tokens: int
    prefill_max_input_len: int | None = None    # the longest single prompt measured; None: none is


def batch_prompt_lens(num_tokens: int, max_prompt_tokens: int) -> list[int]:
    count = math.ceil(num_tokens / max_prompt_tokens)
    base, extra = divmod(num_tokens, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def single_prompts(grid: ProfileGrid, limits: EngineLimits) -> list[int]:
    """The single prompts the engine can run, each longer than the curve's prompts, and its longest prompt (what
    lies beyond the last point measured is extrapolated)."""
    longest = min(limits.prefill_max_input_len or 0, limits.prefill_max_num_tokens)
    if longest <= grid.max_prompt_tokens or not grid.single_prompt_tokens:
        return []
    return [n for n in grid.single_prompt_tokens if grid.max_prompt_tokens < n < longest] + [longest]


def feasible_grid(grid: ProfileGrid, limits: EngineLimits) -> tuple[list[int], list[int], list[int]]:
    tokens = [t for t in grid.prefill_num_tokens if t <= limits.prefill_max_num_tokens]
    batches = [b for b in grid.decode_batch_sizes if b <= limits.decode_max_batch_size]
    contexts = [c for c in grid.decode_context_lens if c + 1 <= limits.decode_max_seq_len]
    while batches and contexts and batches[-1] * (contexts[-1] + 1) > limits.decode_kv_capacity_tokens:
        if len(contexts) > 1 and batches[-1] * (contexts[-2] + 1) <= limits.decode_kv_capacity_tokens:
            contexts.pop()
        else:
            batches.pop()
    if not tokens or not batches or not contexts:
        raise ConfigError(f"the engine's limits ({limits}) leave no profile points; build it with larger "
                          f"max_num_tokens / max_batch_size / KV pool")
    return tokens, batches, contexts


def measure_profile(measure_prefill_s: MeasurePrefill, measure_decode_step_s: MeasureDecode, grid: ProfileGrid,
                    limits: EngineLimits, model: str, kv_dtype: str, tp: int = 1, backend: str = "reference",
                    measured_at: str = "", host: str = "", progress: Progress = lambda _: None,
                    passes: int = 1) -> MeasuredProfile:
    """Each point is the median of `passes` measurements taken in passes over the whole grid, not back to back: a
    slow spell of the machine (a shared VM's speed moved by 1.8x for tens of seconds in this project's runs) then
    reaches one measurement of a point, not all of them, and not a run of neighbouring points."""
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    tokens, batches, contexts = feasible_grid(grid, limits)
    singles = single_prompts(grid, limits)
    prefill_runs: list[list[float]] = [[] for _ in tokens]
    single_runs: list[list[float]] = [[] for _ in singles]
    decode_runs: list[list[list[float]]] = [[[] for _ in contexts] for _ in batches]
    for k in range(passes):
        if passes > 1:
            progress(f"pass {k + 1}/{passes}")
        for runs, t in zip(prefill_runs, tokens):
            runs.append(measure_prefill_s(batch_prompt_lens(t, grid.max_prompt_tokens)))
        for runs, n in zip(single_runs, singles):
            runs.append(measure_prefill_s([n]))
        for row, b in zip(decode_runs, batches):
            for runs, c in zip(row, contexts):
                runs.append(measure_decode_step_s(b, c))
    latencies = [statistics.median(r) for r in prefill_runs]
    single_latencies = [statistics.median(r) for r in single_runs]
    steps = [[statistics.median(r) for r in row] for row in decode_runs]
    for t, latency in zip(tokens, latencies):
        progress(f"prefill {t:>5} tokens: {latency * 1e3:8.1f} ms")
    for n, latency in zip(singles, single_latencies):
        progress(f"prefill one prompt of {n:>5} tokens: {latency * 1e3:8.1f} ms")
    for b, row in zip(batches, steps):
        progress(f"decode batch {b:>3}: " + ", ".join(f"ctx {c} {s * 1e3:.1f} ms" for c, s in zip(contexts, row)))
    return MeasuredProfile(model=model, tp=tp, kv_dtype=kv_dtype, backend=backend, measured_at=measured_at, host=host,
                           kv_capacity_tokens=limits.decode_kv_capacity_tokens,
                           prefill=PrefillCurve(num_tokens=tokens, latency_s=latencies,
                                                prompt_tokens=grid.max_prompt_tokens, single_prompt_tokens=singles,
                                                single_latency_s=single_latencies),
                           decode=DecodeGrid(batch_sizes=batches, context_lens=contexts, step_latency_s=steps))


def with_measured(profiles: list[MeasuredProfile], new: MeasuredProfile) -> list[MeasuredProfile]:
    """Replaces the entry for the same model, TP and KV dtype (or appends)."""
    keep = [p for p in profiles if (p.model, p.tp, p.kv_dtype) != (new.model, new.tp, new.kv_dtype)]
    return keep + [new]
