"""How soon prefill frees the KV of a request that no decode will pull: given up (a RELEASE, frame.py) against
left to the export's deadline, measured in the same run.

    .venv/bin/python benchmarks/kv_give_up.py [--reps 50] [--timeout-s 2.0]

The exporter runs in a separate process (multiprocessing spawn, tcp on 127.0.0.1) and reports when each
request's blocks come back (drain_released, woken by the exporter's callback). Per request, from the moment
this process decides the handle will not be pulled:
- given up: KvImporter.give_up, then the exporter process sees the blocks released;
- left to the deadline (the behaviour before the RELEASE existed): nothing is sent; the blocks come back when the
  export's deadline (--timeout-s after complete(), 30 s by default in a deployment) passes and the reaper runs.
Median, min and max over --reps requests (the deadline case over min(--reps, 5): each takes --timeout-s).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import threading
import time

from trtpd.kv.exporter import KvExporter
from trtpd.kv.handle import generate_key
from trtpd.kv.importer import KvImporter
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool

LAYOUT = KvLayout(num_layers=80, num_kv_heads=8, head_size=128, tokens_per_block=32, dtype="fp16")  # Llama-2-70B


def exporter_process(conn, key: bytes, timeout_s: float) -> None:
    released = threading.Event()
    exporter = KvExporter(KvPool(LAYOUT, 16), key, transport="tcp", transfer_timeout_s=timeout_s,
                          wakeup=released.set)
    conn.send(exporter.endpoint)
    while True:
        command = conn.recv()
        if command is None:
            break
        request_id = command
        exporter.register(request_id, [0, 1], 48)
        conn.send(exporter.complete(request_id, 1))
        while request_id not in exporter.drain_released():   # (one request at a time)
            released.wait(0.5)
            released.clear()
        conn.send(time.time())
    exporter.close()


def timed(conn, importer: KvImporter, request_id: str, give_up: bool) -> float:
    conn.send(request_id)
    params = importer.verify(conn.recv(), time.time())
    start_s = time.time()
    if give_up:
        assert importer.give_up(params) == "released"
    return conn.recv() - start_s


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values) * 1e3:9.2f} ms (min {min(values) * 1e3:.2f}, "
            f"max {max(values) * 1e3:.2f}; {len(values)} requests)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--timeout-s", type=float, default=2.0, help="the export's deadline after complete()")
    args = parser.parse_args()
    key = generate_key()
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=exporter_process, args=(child_conn, key, args.timeout_s))
    child.start()
    try:
        conn.recv()
        importer = KvImporter(KvPool(LAYOUT, 16), key)
        given_up = [timed(conn, importer, f"g{i}", True) for i in range(args.reps)]
        deadline = [timed(conn, importer, f"d{i}", False) for i in range(min(args.reps, 5))]
        print("time until prefill has the blocks of a request no decode will pull back (wall clock, two processes):")
        print(f"  given up (RELEASE)       {spread(given_up)}")
        print(f"  left to the deadline     {spread(deadline)}  (deadline {args.timeout_s:g} s after complete())")
        importer.close()
    finally:
        conn.send(None)
        child.join(10)
        if child.is_alive():
            child.kill()


if __name__ == "__main__":
    main()
