"""An engine's steps as they happen, for accounting a real run against the simulator (opt-in, off by default).

With TRTPD_STEP_TRACE_DIR set in the server's environment (the stubs inherit it), every reference engine appends
one JSON line per forward pass and per loop step to `<dir>/<name>-<pid>.jsonl`:
- {"kind": "forward", "t_s": start, "dt_s": duration, "rows": [[new_tokens, start_pos], ...]}: one
  LlamaModel.forward, its sequences' new tokens and where each starts (a prefill's start_pos is 0 or its reused
  prefix, a decode row's new_tokens is 1),
- {"kind": "step", "t_s": start, "dt_s": the engine's step, "emit_s": handing its outputs on, "outputs": n}: one
  turn of the engine loop that produced output (trtpd/engine/loop.py),
- {"kind": "submit", "t_s": when the serving path handed the request to the engine, "id", "prompt_tokens"} and
  {"kind": "first", "t_s": when the engine handed its first token on, "id"}: where a request's time outside the
  engine goes (benchmarks/step_account.py request_path).
Times are time.monotonic() seconds (one clock for every process of the host). `trtpd profile --serving` fits the
decode step's serving costs from it (trtpd/bench/serving_probe.py); benchmarks/validate_sim.py --step-trace holds
a real run's passes against the perf model the simulator uses.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

ENV = "TRTPD_STEP_TRACE_DIR"


class StepTrace:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._file = os.fdopen(fd, "a", buffering=1)

    def write(self, record: dict) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def host_cpu_s() -> tuple[float, float]:
    """(busy, steal): the host's CPU seconds so far over all its cores (/proc/stat's first line; busy is user, nice,
    system, irq and softirq; steal is time the hypervisor ran something else on a core this guest wanted)."""
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq) * _TICK_S, steal * _TICK_S


BUSY_GAP_S = 0.02   # a pause longer than this between two turns of the loop is idleness (no work), not overhead


@contextlib.contextmanager
def tracing(folder: Path) -> Iterator[Path]:
    """Servers started inside the block trace their engines' steps into `folder` (the variable is set in this
    process's environment, which tritonserver and its stubs inherit, and restored after)."""
    before = os.environ.get(ENV)
    os.environ[ENV] = str(Path(folder).resolve())
    try:
        yield Path(folder)
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


_traces: dict[str, StepTrace | None] = {}


def trace_for(name: str) -> StepTrace | None:
    """This process's trace for `name` when TRTPD_STEP_TRACE_DIR is set, else None (one file per name and pid)."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    if name not in _traces:
        Path(folder).mkdir(parents=True, exist_ok=True, mode=0o700)
        _traces[name] = StepTrace(Path(folder) / f"{name}-{os.getpid()}.jsonl")
    return _traces[name]


def read_trace(folder: Path) -> dict[str, list[dict]]:
    """Every trace file in `folder`, by file stem (<name>-<pid>), its records in order."""
    out = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        out[path.stem] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def shape_of(rows: list[list[int]]) -> tuple[str, int, int, int, int]:
    """A forward pass's shape from its rows: (kind: prefill, decode or mixed; the prompt tokens; their sum of
    squares; the decode rows; the decode rows' context tokens, each row's start_pos + 1)."""
    prefill = [n for n, start in rows if not (n == 1 and start > 0)]
    decode = [start + 1 for n, start in rows if n == 1 and start > 0]
    kind = "mixed" if prefill and decode else ("prefill" if prefill else "decode")
    return kind, sum(prefill), sum(n * n for n in prefill), len(decode), sum(decode)


def prefill_passes(records: list[dict], prompt_tokens: int) -> list[tuple[float, float]]:
    """(start, end) of each prefill-only forward pass over exactly `prompt_tokens` prompt tokens."""
    out = []
    for r in records:
        if r["kind"] == "forward":
            kind, tokens, _, _, _ = shape_of(r["rows"])
            if kind == "prefill" and tokens == prompt_tokens:
                out.append((r["t_s"], r["t_s"] + r["dt_s"]))
    return out


def decode_periods(records: list[dict], within: list[tuple[float, float]] | None = None,
                   apart: list[tuple[float, float]] | None = None) -> list[tuple[int, int, float]]:
    """(decode rows, their context tokens, seconds from the turn's start to the next turn's) for each turn of the
    loop whose one forward pass was decode rows only and which the next turn followed without idling: the step's
    period as a streaming client sees it (a token per sequence per period), serving work in the engine's process
    included. within: only the turns that start and end inside one of these (start, end) spans; apart: only the
    turns that overlap none of them."""
    steps = [r for r in records if r["kind"] == "step"]
    forwards = sorted((r for r in records if r["kind"] == "forward"), key=lambda r: r["t_s"])
    starts = [f["t_s"] for f in forwards]
    out = []
    for step, after in zip(steps, steps[1:]):
        end = step["t_s"] + step["dt_s"] + step["emit_s"]
        if not 0 <= after["t_s"] - end < BUSY_GAP_S:
            continue
        lo, hi = bisect.bisect_left(starts, step["t_s"]), bisect.bisect_right(starts, step["t_s"] + step["dt_s"])
        if hi - lo != 1:
            continue
        kind, _, _, batch, context = shape_of(forwards[lo]["rows"])
        if within is not None and not any(a <= step["t_s"] and after["t_s"] <= b for a, b in within):
            continue
        if apart is not None and any(a < after["t_s"] and step["t_s"] < b for a, b in apart):
            continue
        if kind == "decode":
            out.append((batch, context, after["t_s"] - step["t_s"]))
    return out
