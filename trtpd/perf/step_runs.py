"""Runs of steps that differ only in how much context they hold: the simulator's hot loops.

A simulated instance often takes many steps in a row whose batch does not change: decode steps while no
sequence finishes and nothing joins, and chunked-context steps that each compute one more chunk of the
same prompt beside the same decode rows. Only the KV context (and the chunk's offset in its prompt) grows.
A run computes such steps back to back, from the end of the one running, while fewer than max_steps step
ends were run and each ends before until_s; it returns how many step ends it ran and the state after them.

These generic runs call a step-time function. A performance model may offer its own with the same
arithmetic inlined (RooflinePerfModel.decode_steps, .chunk_steps): the same floats, in the same order.
"""

from __future__ import annotations

import functools
from typing import Callable

# run(context, end_s, busy_s, until_s, max_steps) -> (num_step_ends, context, end_s, busy_s): the step that
# ends at end_s is running; each step end adds batch_size to the context and begins the next step
DecodeSteps = Callable[[int, float, float, float, int], tuple[int, int, float, float]]
# run(done, context, now_s, busy_s, until_s, max_steps) -> (num_step_ends, done, context, end_s, busy_s): a
# step begins at now_s computing chunk_tokens of a prompt of which done tokens are computed; each step end
# adds chunk_tokens to done and batch_size to the context, and begins the next step
ChunkSteps = Callable[[int, int, float, float, float, int], tuple[int, int, int, float, float]]


def decode_steps(step_s: Callable[[int], float], batch_size: int) -> DecodeSteps:
    """Decode steps of batch_size sequences; step_s(context) is a step's duration."""
    def run(context: int, end_s: float, busy_s: float, until_s: float, max_steps: int) -> tuple[int, int, float, float]:
        n = 0
        while n < max_steps and end_s < until_s:
            context += batch_size              # the step ending at end_s
            duration_s = step_s(context)       # the next one begins there
            busy_s += duration_s
            end_s += duration_s
            n += 1
        return n, context, end_s, busy_s
    return run


def chunk_steps(step_s: Callable[[int, int], float], chunk_tokens: int, batch_size: int) -> ChunkSteps:
    """Steps that each compute chunk_tokens more of one prompt beside batch_size decoding sequences;
    step_s(sum_sq_tokens, context) is a step's duration (a chunk of c tokens after k computed ones counts
    c^2 + 2ck squared tokens)."""
    chunk_sq, two_chunk = chunk_tokens * chunk_tokens, 2 * chunk_tokens

    def run(done: int, context: int, now_s: float, busy_s: float, until_s: float,
            max_steps: int) -> tuple[int, int, int, float, float]:
        n, end_s = 0, now_s
        while True:
            duration_s = step_s(chunk_sq + two_chunk * done, context)
            busy_s += duration_s
            end_s += duration_s
            if n >= max_steps or not end_s < until_s:
                return n, done, context, end_s, busy_s
            n += 1                             # its end, and the next one begins
            context += batch_size
            done += chunk_tokens
    return run


def decode_steps_for(perf) -> Callable[[int], DecodeSteps]:
    """batch -> the run of decode steps at that batch on perf: its own (RooflinePerfModel.decode_steps) where it
    has one, else decode_steps over perf.decode_step_s."""
    own = getattr(perf, "decode_steps", None)
    if own is not None:
        return own
    step_s = perf.decode_step_s
    return lambda batch_size: decode_steps(functools.partial(step_s, batch_size), batch_size)


def chunk_steps_for(perf, mixed_step_s: Callable[[int, int, int, int], float]) -> Callable[[int, int], ChunkSteps]:
    """(chunk tokens, batch) -> the run of chunk steps on perf: its own (RooflinePerfModel.chunk_steps) where it
    has one, else chunk_steps over mixed_step_s(prefill tokens, sum of squares, batch, context)."""
    own = getattr(perf, "chunk_steps", None)
    if own is not None:
        return own
    return lambda chunk_tokens, batch_size: chunk_steps(
        lambda sum_sq, context: mixed_step_s(chunk_tokens, sum_sq, batch_size, context), chunk_tokens, batch_size)
