"""Batch invariance by construction: every row-wise computation runs on tiles of exactly TILE_ROWS rows.

Why it holds. Greedy output through the disaggregated path must equal the colocated path bit for
bit, although the two batch requests differently, so a row's result may not depend on how many
rows share its forward pass or which ones. A BLAS library picks its kernel, blocking and reduction
order from the call's shape (M, N, K), strides, pointer alignment, thread count, instruction set and
version; "pad to a multiple of 8" still lets M vary, and MKL/oneDNN on AVX-512 do change kernels at
M >= 12. Here M never varies: the rows of a forward pass are padded to a multiple of TILE_ROWS and
every GEMM, norm and activation is called on one [TILE_ROWS, K] tile at a time, one thread per
process. Each tile is a row slice of one contiguous buffer, 16 rows x 4 bytes x K apart, so every
tile has the same strides and the same 64-byte alignment. The library therefore sees the identical
call for every tile on every machine, and takes the same path for it; inside one GEMM call every
output element is one dot product over K whose order is fixed by K-blocking, not by the row's
position. What is left to trust (a kernel whose result depends on a row's position inside the
tile, or on the other rows' values) is what `check_batch_invariance` verifies at load, over every
row count the engine runs, refusing to load when it fails.
Attention runs per sequence on its own K/V (its shape depends only on that sequence); RoPE and
residual adds are elementwise IEEE operations, exact whatever the vectorization.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

TILE_ROWS = 16

# A kernel y = x @ weight.T, called with x of exactly TILE_ROWS rows. Tests pass a deliberately
# non-invariant one to see the load-time check refuse it.
Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def padded_rows(num_rows: int) -> int:
    return max(TILE_ROWS, -(-num_rows // TILE_ROWS) * TILE_ROWS)


def pad_rows(x: torch.Tensor, num_rows: int) -> torch.Tensor:
    """x in a fresh contiguous buffer of `num_rows` rows, the extra rows zero."""
    out = x.new_zeros(num_rows, *x.shape[1:])
    out[:x.shape[0]] = x
    return out


def tile_map(fn: Callable[..., torch.Tensor], *xs: torch.Tensor) -> torch.Tensor:
    """Applies `fn` to aligned TILE_ROWS-row tiles of equally padded inputs; concatenates the results."""
    num_rows = xs[0].shape[0]
    if num_rows % TILE_ROWS or any(x.shape[0] != num_rows for x in xs):
        raise ValueError(f"tile_map needs inputs padded to a multiple of {TILE_ROWS} rows, got "
                         f"{[x.shape[0] for x in xs]}")
    return torch.cat([fn(*(x[t:t + TILE_ROWS] for x in xs)) for t in range(0, num_rows, TILE_ROWS)])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


# ---- the load-time check --------------------------------------------------------------------
@dataclass
class BatchInvarianceReport:
    """What `check_batch_invariance` verified on this machine."""

    tile_rows: int
    max_rows: int                       # the largest forward pass (rows) checked
    num_row_counts: int                 # how many distinct row counts were checked
    seconds: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def row_counts_to_check(max_rows: int) -> list[int]:
    """Every count up to two tiles and one more (every tail size, every position next to every
    neighbour), then one row past 4, 16, 64, ... tiles, then max_rows: beyond two tiles a larger pass
    only repeats the same tile call, so a sparse ladder up to the engine's largest pass suffices."""
    counts = set(range(1, min(max_rows, 2 * TILE_ROWS + 1) + 1))
    tiles = 4
    while tiles * TILE_ROWS < max_rows:
        counts.add(tiles * TILE_ROWS + 1)
        tiles *= 4
    counts.add(max_rows)
    return sorted(counts)


def check_batch_invariance(blocks: dict[str, tuple[Callable[..., torch.Tensor], list[int]]],
                           max_rows: int, seed: int = 0) -> BatchInvarianceReport:
    """Runs each row-wise block on batches of every count in `row_counts_to_check(max_rows)` and
    compares every row, bit for bit, with the same row computed alone.

    `blocks` maps a name to (fn, input widths): fn takes padded inputs of those widths (through
    `tile_map`, as the model's forward pass calls it). Batch rows are drawn from a small pool at
    shifting offsets, so each pool row is seen at many tile positions next to many neighbours.
    """
    started = time.perf_counter()
    counts = row_counts_to_check(max_rows)
    gen = torch.Generator().manual_seed(seed)
    pool_rows = 2 * TILE_ROWS + 3            # coprime with TILE_ROWS: rows visit every tile position
    problems = []
    for name, (fn, widths) in blocks.items():
        pool = [torch.randn(pool_rows, w, generator=gen) for w in widths]
        solo = torch.cat([tile_map(fn, *(pad_rows(p[r:r + 1], TILE_ROWS) for p in pool))[:1]
                          for r in range(pool_rows)])
        for n in counts:
            index = (torch.arange(n) * 5 + n) % pool_rows
            padded = padded_rows(n)
            batch = tile_map(fn, *(pad_rows(p[index], padded) for p in pool))[:n]
            bad = (batch != solo[index]).any(dim=-1).nonzero().reshape(-1)
            if bad.numel():
                diff = float((batch - solo[index]).abs().max())
                problems.append(f"{name}: in a forward pass of {n} rows, {bad.numel()} row(s) differ from the "
                                f"same rows computed alone (first at row {int(bad[0])}, max |diff| {diff:.3g})")
                break
    return BatchInvarianceReport(TILE_ROWS, max(counts), len(counts), time.perf_counter() - started, problems)


def default_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def concat_weights(parts: Iterable[torch.Tensor]) -> torch.Tensor:
    return torch.cat(list(parts)).contiguous()
