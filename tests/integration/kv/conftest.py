"""Fixtures: a real prefill-side process (exporter_child.py) that hosts KV exporters for the tests to pull from."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from trtpd.kv.handle import generate_key
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import SHM_DIR, KvPool

CHILD = Path(__file__).with_name("exporter_child.py")
# ucx and mpi do not share a process (ucxx's libucp 1.19 and MPICH's UCX netmod are the same libucp.so.0): mpi
# runs in a pytest process of its own, which test_kv_mpi.py starts in the suite; by hand:
#   TRTPD_TEST_KV_TRANSPORTS=mpi .venv/bin/python -m pytest tests/integration/kv -k mpi
TRANSPORTS_ENV = "TRTPD_TEST_KV_TRANSPORTS"


def transports_under_test() -> tuple[str, ...]:
    return tuple(os.environ.get(TRANSPORTS_ENV, "tcp,shm,ucx").split(","))
ANSWER_TIMEOUT_S = 30.0


class PrefillProcess:
    """The child process and its JSON-lines conversation."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=Path(__file__).parents[3], env=env)
        self._answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):      # (UCX and MPI libraries log warnings to stdout)
                self._answers.put(json.loads(line))
        self._answers.put({"error": f"prefill process exited with {self.proc.wait()}"})

    def call(self, cmd: str, answer_timeout_s: float = ANSWER_TIMEOUT_S, **args) -> dict:
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        answer = self._answers.get(timeout=answer_timeout_s)
        if "error" in answer:
            raise RuntimeError(f"prefill process: {cmd}: {answer['error']}")
        return answer

    def stop(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


@dataclass
class RemoteExporter:
    """One exporter in the prefill process, over a seeded pool in /dev/shm."""

    process: PrefillProcess
    name: str
    layout: KvLayout
    num_blocks: int
    shm_name: str
    seed: int
    endpoint: str
    is_closed: bool = False

    def call(self, cmd: str, **args) -> dict:
        return self.process.call(cmd, name=self.name, **args)

    def register(self, request_id: str, block_ids: list[int], num_tokens: int) -> bytes:
        return bytes.fromhex(self.call("register", request_id=request_id, block_ids=block_ids,
                                       num_tokens=num_tokens)["handle"])

    def mark(self, request_ids: list[str], layer: int) -> None:
        self.call("mark", request_ids=request_ids, layer=layer)

    def complete(self, request_id: str, first_token: int) -> bytes:
        return bytes.fromhex(self.call("complete", request_id=request_id, first_token=first_token)["handle"])

    def fail(self, request_id: str, reason: str) -> None:
        self.call("fail", request_id=request_id, reason=reason)

    def wait_released(self, request_id: str, timeout_s: float = 10.0) -> bool:
        return self.process.call("wait_released", answer_timeout_s=timeout_s + 10, name=self.name,
                                 request_id=request_id, timeout_s=timeout_s)["released"]

    def stats(self) -> dict:
        return self.call("stats")

    def close(self) -> None:
        if not self.is_closed:
            self.call("close")
            self.is_closed = True

    def expected_bytes(self) -> torch.Tensor:
        """The pool's bytes as [layers, blocks, 2, tokens_per_block, token bytes]."""
        generator = torch.Generator().manual_seed(self.seed)
        nbytes = KvPool.nbytes_for(self.layout, self.num_blocks)
        flat = torch.randint(0, 256, (nbytes,), generator=generator, dtype=torch.uint8)
        return flat.view(self.layout.num_layers, self.num_blocks, 2, self.layout.tokens_per_block, -1)


class Exporters:
    """Starts exporters for one test and closes them (and checks their /dev/shm segments are gone) after it."""

    def __init__(self, process: PrefillProcess, prefix: str) -> None:
        self.process, self.prefix = process, prefix
        self.key = generate_key()
        self.started: list[RemoteExporter] = []

    def start(self, transport: str, layout: KvLayout, num_blocks: int = 16, timeout_s: float = 30.0,
              key: bytes | None = None) -> RemoteExporter:
        n = len(self.started)
        name, shm_name, seed = f"{self.prefix}_{n}", f"{self.prefix}_{n}", 1000 + n
        answer = self.process.call("start", name=name, layout=layout.to_dict(), num_blocks=num_blocks,
                                   shm_name=shm_name, seed=seed, key_hex=(key or self.key).hex(),
                                   transport=transport, timeout_s=timeout_s)
        exporter = RemoteExporter(self.process, name, layout, num_blocks, shm_name, seed, answer["endpoint"])
        self.started.append(exporter)
        return exporter

    def close(self) -> None:
        for exporter in self.started:
            exporter.close()
            assert not (SHM_DIR / exporter.shm_name).exists(), f"{exporter.shm_name} left in /dev/shm"


@pytest.fixture(scope="module")
def prefill_process():
    process = PrefillProcess()
    prefix = f"trtpd_test_{os.getpid()}_"
    try:
        yield process
    finally:
        process.stop()
        for path in SHM_DIR.glob(f"{prefix}*"):
            path.unlink(missing_ok=True)


@pytest.fixture
def exporters(prefill_process, tmp_path):
    exporters = Exporters(prefill_process, f"trtpd_test_{os.getpid()}_{tmp_path.name}")
    try:
        yield exporters
    finally:
        exporters.close()

