"""KV transfer bandwidth per transport next to single-thread memcpy, and how much of it layer-wise pulling hides.

    .venv/bin/python benchmarks/kv_transfer.py [--quick] [--tokens 2048] [--per-layer-compute-ms 2.0]

The KV is Llama-2-70B-shaped (80 layers, 8 KV heads, head size 128, 32 tokens per block), fp16 and fp8.
The exporter runs in a separate process (multiprocessing spawn) on a pool in /dev/shm; this process pulls
into its own pool over shm, tcp, ucx and mpi. Both processes load ucxx before MPI starts, so MPICH runs its ofi
netmod on both sides (trtpd/kv/mpi_mover.py: ucxx and MPICH's UCX netmod cannot share a process).
memcpy is torch's copy_ of the same byte count with 1 thread, measured in the same run
(first, before any exporter process starts; median of max(--reps, 9)).
Transfer times are medians over --reps pulls, each from connect to the exporter's confirmation.
Set-up: the first pull of a transport between the two processes is a one-block (32-token) request; the
connection, the UCX endpoint or MPI's start and handshake, and page mappings happen there. Set-up = that pull
minus the median of --reps later one-block pulls: what a transport costs once per pair of processes.

Layer-wise: the exporter emulates prefill compute by sleeping --per-layer-compute-ms per layer (a GPU does
not use the CPU for it) and marks each layer ready. The default, 2.0 ms x 80 layers = 160 ms, is a
Llama-2-70B 2,048-token prefill on 4 x H100 (TP4, bf16, ~45% MFU: 2.9e14 FLOP / (4 x 989e12 x 0.45)).
Exposed transfer time is from the last layer's completion to the pull's confirmation, when decode
(a) pulls only after prefill completes, or (b) starts pulling when the handle is issued and receives
layers as they become ready. Hidden fraction = 1 - (b) / (a).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import threading
import time

import torch

from trtpd.kv.exporter import KvExporter
from trtpd.kv.handle import generate_key
from trtpd.kv.importer import KvImporter
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import SHM_DIR, KvPool
from trtpd.kv.spans import num_blocks_for, pool_bytes

TRANSPORTS = ("shm", "tcp", "ucx", "mpi")   # in this order: ucxx is loaded before MPI starts (ofi netmod)


def llama2_70b_layout(dtype: str) -> KvLayout:
    return KvLayout(num_layers=80, num_kv_heads=8, head_size=128, tokens_per_block=32, dtype=dtype)


def exporter_process(conn, layout: KvLayout, num_blocks: int, shm_name: str, key: bytes) -> None:
    """Child: a shm pool full of random bytes and one exporter per transport, driven by commands on `conn`."""
    torch.set_num_threads(1)
    pool = KvPool(layout, num_blocks, shm_name=shm_name)
    pool_bytes(pool)[:] = torch.randint(0, 256, (pool.nbytes,), dtype=torch.uint8).numpy()
    exporters = {t: KvExporter(pool, key, transport=t, transfer_timeout_s=60.0) for t in TRANSPORTS}
    block_ids = list(range(num_blocks))
    try:
        conn.send("ready")
        while True:
            command, *args = conn.recv()
            if command == "stop":
                return
            transport, request_id, num_tokens = args[:3]
            exporter = exporters[transport]
            if command == "register":
                conn.send(exporter.register(request_id, block_ids[:num_blocks_for(num_tokens, 32)], num_tokens))
            elif command == "prefill":   # paced layers, then complete; replies with the completion time
                per_layer_s = args[3]
                start_s = time.perf_counter()
                for layer in range(layout.num_layers):
                    time.sleep(max(start_s + (layer + 1) * per_layer_s - time.perf_counter(), 0.0))
                    exporter.mark_layers_ready([request_id], layer)
                handle = exporter.complete(request_id, 7)
                conn.send((time.perf_counter(), handle))
            exporter.drain_released()
    finally:
        for exporter in exporters.values():
            exporter.close()
        pool.close()


def median_memcpy_s(num_bytes: int, reps: int) -> float:
    src = torch.randint(0, 256, (num_bytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        start_s = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start_s)
    return statistics.median(times)


class Bench:
    def __init__(self, layout: KvLayout, num_tokens: int, key: bytes) -> None:
        self.layout, self.num_tokens = layout, num_tokens
        num_blocks = num_blocks_for(num_tokens, layout.tokens_per_block)
        self.shm_name = f"trtpd_bench_{os.getpid()}_{layout.dtype.value}"
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.child = ctx.Process(target=exporter_process, args=(child_conn, layout, num_blocks, self.shm_name, key))
        self.child.start()
        self.pool = KvPool(layout, num_blocks)
        self.importer = KvImporter(self.pool, key)
        self.dst_block_ids = list(range(num_blocks))
        self.num_requests = 0
        if not self.conn.poll(120):
            raise RuntimeError("exporter process did not start")
        self.conn.recv()

    def _call(self, *command):
        self.conn.send(command)
        return self.conn.recv()

    def _next_id(self) -> str:
        self.num_requests += 1
        return f"req-{self.num_requests}"

    def pull_after_complete(self, transport: str) -> tuple[float, float]:
        """Prefill with no pacing, then pull: (pull seconds, exposed seconds after completion)."""
        return self._after_complete(transport, 0.0)

    def _after_complete(self, transport: str, per_layer_s: float, num_tokens: int = 0) -> tuple[float, float]:
        request_id, num_tokens = self._next_id(), num_tokens or self.num_tokens
        self._call("register", transport, request_id, num_tokens)
        completed_s, handle = self._call("prefill", transport, request_id, num_tokens, per_layer_s)
        dst_block_ids = self.dst_block_ids[:num_blocks_for(num_tokens, self.layout.tokens_per_block)]
        result = self.importer.pull(self.importer.verify(handle, time.time()), dst_block_ids)
        assert result.bytes_moved == self.layout.bytes_for(num_tokens)
        return result.seconds, time.perf_counter() - completed_s

    def small_pull_s(self, transport: str) -> float:
        """One block (32 tokens), no pacing: the connection's cost more than the bytes'."""
        return self._after_complete(transport, 0.0, self.layout.tokens_per_block)[0]

    def exposed_layer_wise_s(self, transport: str, per_layer_s: float) -> float:
        request_id = self._next_id()
        params = self.importer.verify(self._call("register", transport, request_id, self.num_tokens), time.time())
        finished = {}
        puller = threading.Thread(target=lambda: finished.update(
            result=self.importer.pull(params, self.dst_block_ids), end_s=time.perf_counter()))
        puller.start()
        completed_s, _ = self._call("prefill", transport, request_id, self.num_tokens, per_layer_s)
        puller.join()
        assert finished["result"].first_token == 7
        return finished["end_s"] - completed_s

    def exposed_after_complete_s(self, transport: str, per_layer_s: float) -> float:
        return self._after_complete(transport, per_layer_s)[1]

    def close(self) -> None:
        try:
            self.conn.send(("stop",))
        finally:
            self.child.join(timeout=10)
            if self.child.is_alive():
                self.child.terminate()
            self.importer.close()
            (SHM_DIR / self.shm_name).unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=7, help="pulls per transport and dtype (median)")
    parser.add_argument("--layer-wise-reps", type=int, default=5)
    parser.add_argument("--per-layer-compute-ms", type=float, default=2.0,
                        help="emulated prefill compute per layer (default: Llama-2-70B, 2k tokens, 4xH100)")
    parser.add_argument("--quick", action="store_true", help="2 reps, 1 layer-wise rep")
    args = parser.parse_args()
    if args.quick:
        args.reps, args.layer_wise_reps = 2, 1
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    key = generate_key()
    per_layer_s = args.per_layer_compute_ms / 1e3
    bandwidth_rows, layer_rows = [], []
    dtypes = ("fp16", "fp8")
    memcpy_s = {d: median_memcpy_s(llama2_70b_layout(d).bytes_for(args.tokens), max(args.reps, 9)) for d in dtypes}
    for dtype in dtypes:
        layout = llama2_70b_layout(dtype)
        num_bytes = layout.bytes_for(args.tokens)
        bench = Bench(layout, args.tokens, key)
        try:
            for transport in TRANSPORTS:
                first_s = bench.small_pull_s(transport)             # the first pull: connection set-up
                small_s = statistics.median(bench.small_pull_s(transport) for _ in range(max(args.reps, 5)))
                bench.pull_after_complete(transport)                  # warm-up: page mappings of the pool
                pulls_s = [bench.pull_after_complete(transport)[0] for _ in range(args.reps)]
                bandwidth_rows.append((dtype, num_bytes, memcpy_s[dtype], transport, statistics.median(pulls_s),
                                       min(pulls_s), first_s, small_s))
                after_s = statistics.median(bench.exposed_after_complete_s(transport, per_layer_s)
                                            for _ in range(args.layer_wise_reps))
                wise_s = statistics.median(bench.exposed_layer_wise_s(transport, per_layer_s)
                                           for _ in range(args.layer_wise_reps))
                layer_rows.append((dtype, transport, after_s, wise_s))
        finally:
            bench.close()
    print_tables(args, bandwidth_rows, layer_rows)
    print(f"\nload average (1 min) before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f} "
          f"(other work on these CPUs slows the transports, tcp most: it keeps two cores busy)")


def print_tables(args, bandwidth_rows, layer_rows) -> None:
    print(f"KV transfer, Llama-2-70B shape (80 layers, 8 KV heads, head 128, 32 tokens/block), {args.tokens} tokens; "
          f"exporter in a separate process; {os.cpu_count()} CPUs; medians of {args.reps} pulls")
    print(f"{'dtype':<6}{'KV bytes':>14}{'memcpy 1 thr':>14}{'transport':>11}{'pull':>10}{'GB/s':>8}{'% memcpy':>10}"
          f"{'best GB/s':>11}{'1st 1-block':>13}{'1-block':>9}{'set-up':>9}")
    for dtype, num_bytes, memcpy_s, transport, pull_s, best_s, first_s, small_s in bandwidth_rows:
        print(f"{dtype:<6}{num_bytes:>14,}{num_bytes / memcpy_s / 1e9:>9.2f} GB/s{transport:>11}"
              f"{pull_s * 1e3:>7.1f} ms{num_bytes / pull_s / 1e9:>8.2f}{100 * memcpy_s / pull_s:>9.0f}%"
              f"{num_bytes / best_s / 1e9:>11.2f}{first_s * 1e3:>10.1f} ms{small_s * 1e3:>6.1f} ms"
              f"{(first_s - small_s) * 1e3:>6.1f} ms")
    print("(set-up = the first one-block pull between the two processes - the median later one: connection, UCX "
          "endpoint, or MPI's start in both processes and its handshake)")
    print()
    print(f"Layer-wise pulling: prefill emulated as {args.per_layer_compute_ms:g} ms x 80 layers = "
          f"{args.per_layer_compute_ms * 80:g} ms; exposed = last layer ready -> pull confirmed; "
          f"medians of {args.layer_wise_reps}")
    print(f"{'dtype':<6}{'transport':>10}{'pull after complete':>21}{'layer-wise':>12}{'hidden':>9}")
    for dtype, transport, after_s, wise_s in layer_rows:
        print(f"{dtype:<6}{transport:>10}{after_s * 1e3:>18.1f} ms{wise_s * 1e3:>9.1f} ms"
              f"{100 * (1 - wise_s / after_s):>8.0f}%")


if __name__ == "__main__":
    main()
