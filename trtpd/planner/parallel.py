"""Two independent computations at once: one in a forked child process, one here.

The planner's simulations are independent of each other and deterministic (same seeds), so running the
disaggregated side's goodput search beside the colocated one changes no figure, and on a machine with two
cores takes the longer of the two instead of their sum. Where fork is not available, or the child fails
for any reason (or does not answer in time), the first computation runs here after the second: the same
result, later. A process running other threads does not fork: a child gets a copy of every lock those threads
held at that moment (logging's, an executor's queue), and one of them held is a child that never finishes
(the unit tier, after tests that left threads behind, waited MIN_WAIT_S for such a child).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from typing import Callable, TypeVar

A = TypeVar("A")
B = TypeVar("B")


def can_fork() -> bool:
    return hasattr(os, "fork") and sys.platform != "darwin" and (os.cpu_count() or 1) > 1 \
        and threading.active_count() == 1


# how long the parent waits for the child once its own part is done: this many times what its own part took,
# and at least MIN_WAIT_S (the two parts take comparable times; a child that outlives that is stuck)
WAIT_FACTOR = 20.0
MIN_WAIT_S = 60.0


def both(first: Callable[[], A], second: Callable[[], B], parallel: bool = True,
         min_wait_s: float = MIN_WAIT_S) -> tuple[A, B]:
    """(first(), second()); with parallel and fork, first() runs in a child process while second() runs
    here. first()'s result must pickle; neither may rely on the other's side effects. A child that has not
    answered max(min_wait_s, WAIT_FACTOR x second()'s time) after second() returned is killed, and
    first() runs here."""
    if not (parallel and can_fork()):
        return first(), second()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child: compute, send, leave without cleanup
        os.close(read_fd)
        try:
            data = pickle.dumps(("ok", first()), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:                     # noqa: BLE001 (reported to the parent, which recomputes)
            data = pickle.dumps(("error", traceback.format_exc()))
        with os.fdopen(write_fd, "wb") as out:
            out.write(data)
        os._exit(0)
    os.close(write_fd)
    started = time.monotonic()
    try:
        b = second()
    except BaseException:                         # its result is not needed any more
        _stop(pid, read_fd, kill=True)
        raise
    data = _read_until(read_fd, time.monotonic() + max(min_wait_s, WAIT_FACTOR * (time.monotonic() - started)))
    _stop(pid, read_fd, kill=data is None)        # stuck: its result is computed here instead
    try:
        status, a = pickle.loads(data) if data is not None else ("stuck", None)
    except Exception:                             # noqa: BLE001 (a child killed before it wrote)
        status, a = "error", None
    if status != "ok":
        a = first()
    return a, b


def _stop(pid: int, read_fd: int, kill: bool) -> None:
    if kill:
        os.kill(pid, signal.SIGKILL)
    os.close(read_fd)
    os.waitpid(pid, 0)


def _read_until(fd: int, deadline: float) -> bytes | None:
    """Everything the child writes until it closes its end; None if that has not happened by deadline."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
