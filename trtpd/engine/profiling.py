"""Timing hooks for `trtpd profile`: the reference engine's forward pass, measured on this machine.

Prefill latency for a batch of prompt lengths (prompts packed without padding, as the prefill engine
runs them) and decode step latency for a batch size and context length. Each call reports the
median of `repeats` runs after one warm-up run, on one thread (as the role models run).
"""

from __future__ import annotations

import statistics
import time
from functools import lru_cache
from pathlib import Path

import torch

from trtpd.engine.engine_config import EngineConfig
from trtpd.engine.loader import load_model
from trtpd.engine.model import LlamaModel, SeqChunk
from trtpd.kv.pool import KvPool
from trtpd.sched.block_allocator import num_blocks_for


@lru_cache(maxsize=4)
def _model(engine_dir: str) -> tuple[EngineConfig, LlamaModel, object]:
    config, checkpoint, model, _ = load_model(Path(engine_dir))
    return config, model, checkpoint.layout(config.tokens_per_block)


def _time(model: LlamaModel, chunks: list[SeqChunk], pool: KvPool, repeats: int) -> float:
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
            started = time.perf_counter()
            model.forward(chunks, pool)
            if i:   # the first run warms up allocations and kernels
                times.append(time.perf_counter() - started)
    return statistics.median(times)


def _chunks(new_tokens: list[int], tokens_per_block: int, start_pos: int = 0) -> tuple[list[SeqChunk], int]:
    """Sequences feeding `n` new tokens each at positions start_pos..; block tables cover their whole context."""
    chunks, next_block = [], 0
    for n in new_tokens:
        blocks = num_blocks_for(start_pos + n, tokens_per_block)
        chunks.append(SeqChunk([3 + (i * 7919) % 1000 for i in range(n)], start_pos,
                               list(range(next_block, next_block + blocks))))
        next_block += blocks
    return chunks, next_block


def measure_prefill_s(engine_dir: Path, batch_prompt_lens: list[int], repeats: int = 3) -> float:
    """Seconds for one prefill forward pass over prompts of these lengths."""
    config, model, layout = _model(str(engine_dir))
    chunks, num_blocks = _chunks(list(batch_prompt_lens), config.tokens_per_block)
    return _time(model, chunks, KvPool(layout, max(num_blocks, 1)), repeats)


def measure_decode_step_s(engine_dir: Path, batch_size: int, context_len: int, repeats: int = 3) -> float:
    """Seconds for one decode step of `batch_size` sequences, each with `context_len` tokens of context."""
    config, model, layout = _model(str(engine_dir))
    chunks, num_blocks = _chunks([1] * batch_size, config.tokens_per_block, start_pos=context_len - 1)
    return _time(model, chunks, KvPool(layout, num_blocks), repeats)


# A few of the profile's own shapes, timed again in a minute: (decode batch, context) and prefill prompt lengths
SPEED_DECODE = ((1, 256), (4, 256), (8, 256))
SPEED_PREFILL = ((64,) * 8, (512,))


def speed_ratio(engine_dir: Path, perf, repeats: int = 10) -> float:
    """How fast this machine runs the engine now against the profile `perf` (the measured curves without serving
    costs: MeasuredPerfModel(profile)): the geometric mean, over a few of the profile's shapes, of the time now over
    the profile's (above 1: slower now). About a second at 10 repeats; benchmarks/validate_sim.py measures it around each real
    deployment, on a machine whose speed moves by tens of percent between minutes."""
    ratios = [measure_decode_step_s(engine_dir, b, ctx, repeats) / perf.decode_step_s(b, b * ctx)
              for b, ctx in SPEED_DECODE]
    ratios += [measure_prefill_s(engine_dir, list(lens), max(3, repeats // 3))
               / perf.prefill_s(sum(lens), sum(n * n for n in lens)) for lens in SPEED_PREFILL]
    return float(statistics.geometric_mean(ratios))
