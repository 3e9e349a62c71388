"""Cost of batch invariance by construction: the reference model's forward pass with every row-wise
block run on TILE_ROWS-row tiles (what the engines run) against the same pass with one call per block
over all rows (fast, not batch-invariant), measured side by side in one run, one thread.

    .venv/bin/python benchmarks/forward_tiles.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import trtpd.engine.model as model_module
from trtpd.catalog import get_model
from trtpd.engine.model import LlamaModel, SeqChunk, init_weights
from trtpd.engine.row_tiles import TILE_ROWS
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool

CASES = {"prefill 1 x 1500 tokens": [1500], "prefill 4 x 300 tokens": [300] * 4,
         "decode batch 1": [1] * 1, "decode batch 8": [1] * 8, "decode batch 32": [1] * 32}


def untiled_map(fn, *xs):
    return fn(*xs)


def chunks_for(lengths: list[int], context_tokens: int = 256) -> list[SeqChunk]:
    out, block = [], 0
    for n in lengths:
        start = context_tokens if n == 1 else 0     # a decode row attends to a 256-token context
        num_blocks = -(-(start + n) // 32)
        out.append(SeqChunk([5] * n, start, list(range(block, block + num_blocks))))
        block += num_blocks
    return out


def median_s(model: LlamaModel, chunks: list[SeqChunk], pool: KvPool, repeats: int) -> float:
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
            started = time.perf_counter()
            model.forward(chunks, pool)
            if i:
                times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per case (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = get_model("tiny-llama")
    model = LlamaModel(spec, init_weights(spec, 0), [0.02] * spec.num_layers, [0.02] * spec.num_layers)
    pool = KvPool(KvLayout.for_model(spec, "fp16", 32), 512)
    tiled = model_module.tile_map
    print(f"tiny-llama, 1 thread, tiles of {TILE_ROWS} "
          f"rows, median of {args.repeats}")
    print("| case | tiled (invariant) ms | one call per block ms | ratio |\n|---|---|---|---|")
    for name, lengths in CASES.items():
        chunks = chunks_for(lengths)
        model_module.tile_map = untiled_map
        base = median_s(model, chunks, pool, args.repeats)
        model_module.tile_map = tiled
        inv = median_s(model, chunks, pool, args.repeats)
        print(f"| {name} | {inv * 1e3:.2f} | {base * 1e3:.2f} | {inv / base:.2f}x |")


if __name__ == "__main__":
    main()
