"""What only the mpi transport has: links (intercommunicators) kept between two processes, one connection
handshake at a time per process, the ofi netmod, and MPICH's /dev/shm segment unlinked. These tests exist in the mpi run only
(test_kv_mpi.py starts it; MPI cannot share this process with ucxx), beside the parametrised tests over mpi."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.integration.kv.conftest import Exporters, PrefillProcess, transports_under_test
from tests.integration.kv.importer_child import block_digest
from trtpd.kv.errors import KvPrefillFailedError
from trtpd.kv.importer import KvImporter
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import SHM_DIR, KvPool

pytestmark = pytest.mark.integration
LAYOUT = KvLayout(num_layers=4, num_kv_heads=2, head_size=16, tokens_per_block=8, dtype="fp8")
IMPORTER = Path(__file__).with_name("importer_child.py")
ROOT = Path(__file__).parents[3]


def expected_digest(exporter, src_ids: list[int], num_tokens: int) -> str:
    return block_digest(exporter.expected_bytes(), exporter.layout, src_ids, num_tokens)


def pulled_digest(pool: KvPool, dst_ids: list[int], num_tokens: int) -> str:
    layout = pool.layout
    received = pool.data.view(torch.uint8).view(layout.num_layers, pool.num_blocks, 2, layout.tokens_per_block, -1)
    return block_digest(received, layout, dst_ids, num_tokens)


def start_importer(key: bytes, handle: bytes, dst_ids: list[int], env: dict[str, str] | None = None):
    proc = subprocess.Popen([sys.executable, str(IMPORTER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    proc.stdin.write(json.dumps({"key_hex": key.hex(), "handle_hex": handle.hex(), "dst_block_ids": dst_ids,
                                 "num_blocks": 4}) + "\n")
    proc.stdin.flush()
    return proc


def outcome_lines(proc) -> list[str]:
    out, _ = proc.communicate(timeout=60)
    return [line for line in out.splitlines() if line.startswith(("done", "error", "digest"))]


def handshakes() -> int:
    from trtpd.kv.mpi_mover import MpiWorld
    return MpiWorld.get().num_handshakes


if "mpi" in transports_under_test():

    def test_first_pulls_of_several_decode_processes_at_once_are_bit_exact(exporters):
        """Three fresh decode processes pull at the same moment: three connection handshakes reach the exporter
        together (MPICH's handshakes cross-match when two run at once in a process: the old SIGSEGV)."""
        exporter = exporters.start("mpi", LAYOUT, num_blocks=16)
        requests = {f"r{i}": ([4 * i, 4 * i + 1, 4 * i + 2], [2, 0, 1], 19 + i) for i in range(3)}
        children = []
        try:
            for request_id, (src_ids, dst_ids, num_tokens) in requests.items():
                handle = exporter.register(request_id, src_ids, num_tokens)
                children.append((request_id, start_importer(exporters.key, handle, dst_ids)))
            for layer in range(LAYOUT.num_layers):
                exporter.mark(list(requests), layer)
            for i, request_id in enumerate(requests):
                exporter.complete(request_id, 100 + i)
            for i, (request_id, proc) in enumerate(children):
                src_ids, _, num_tokens = requests[request_id]
                assert outcome_lines(proc) == [f"done {100 + i}",
                                               f"digest {expected_digest(exporter, src_ids, num_tokens)}"]
        finally:
            for _, proc in children:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for request_id in requests:
            assert exporter.wait_released(request_id)
        stats = exporter.stats()
        assert (stats["num_pulls"], stats["num_broken_pulls"], stats["num_pending"]) == (3, 0, 0)
        assert stats["mpi_handshakes"] >= 3      # one per decode process (and earlier tests' in this process)

    def test_first_pulls_from_two_prefill_processes_at_once_from_worker_threads(exporters):
        """Two handshakes wanted at once in this (decode) process (it has no link to either prefill process
        yet: the test before pulled from other processes): one after the other, both pulls exact."""
        other = PrefillProcess()
        others = Exporters(other, f"trtpd_test_{os.getpid()}_other_")
        try:
            groups = [exporters, others]
            both = [g.start("mpi", LAYOUT, num_blocks=8) for g in groups]
            dst = KvPool(LAYOUT, 16)
            importers = [KvImporter(dst, g.key) for g in groups]
            before = handshakes()
            outcomes: dict[int, object] = {}
            pulls = []
            for i, (exporter, importer) in enumerate(zip(both, importers)):
                params = importer.verify(exporter.register("x", [1, 3, 5], 20), time.time())

                def run(i=i, importer=importer, params=params):
                    try:
                        outcomes[i] = importer.pull(params, [8 * i, 8 * i + 1, 8 * i + 2])
                    except Exception as e:  # noqa: BLE001 - inspected below
                        outcomes[i] = e
                pulls.append(threading.Thread(target=run, daemon=True))
            for thread in pulls:
                thread.start()
            for exporter in both:
                for layer in range(LAYOUT.num_layers):
                    exporter.mark(["x"], layer)
                exporter.complete("x", 3)
            for thread in pulls:
                thread.join(timeout=30)
            for i, exporter in enumerate(both):
                assert getattr(outcomes.get(i), "first_token", None) == 3, outcomes
                assert (pulled_digest(dst, [8 * i, 8 * i + 1, 8 * i + 2], 20)
                        == expected_digest(exporter, [1, 3, 5], 20))
                assert exporter.wait_released("x")
            assert handshakes() == before + 2
            for importer in importers:
                importer.close()
            others.close()
        finally:
            other.stop()
            for path in SHM_DIR.glob(f"{others.prefix}*"):
                path.unlink(missing_ok=True)

    def test_pulls_between_two_processes_reuse_one_link_and_a_failed_pull_retires_it(exporters):
        exporter = exporters.start("mpi", LAYOUT, num_blocks=8)
        dst = KvPool(LAYOUT, 8)
        importer = KvImporter(dst, exporters.key)

        def pull(request_id: str, src_ids: list[int], dst_ids: list[int], num_tokens: int) -> None:
            exporter.register(request_id, src_ids, num_tokens)
            params = importer.verify(exporter.complete(request_id, 7), time.time())
            assert importer.pull(params, dst_ids).first_token == 7
            assert pulled_digest(dst, dst_ids, num_tokens) == expected_digest(exporter, src_ids, num_tokens)
            assert exporter.wait_released(request_id)

        pull("a", [1, 2], [5, 6], 13)            # the first pull between the two processes may need a handshake
        mine, theirs = handshakes(), exporter.stats()["mpi_handshakes"]
        for n, request_id in enumerate(["b", "c", "d"]):
            pull(request_id, [n, 7], [3, n + 4], 16)
        assert (handshakes(), exporter.stats()["mpi_handshakes"]) == (mine, theirs)     # one link, reused

        params = importer.verify(exporter.register("f", [3], 8), time.time())
        got_layer, outcome = threading.Event(), {}

        def failing_pull():
            try:
                importer.pull(params, [0], on_layer=lambda layer: got_layer.set())
            except Exception as e:  # noqa: BLE001 - inspected below
                outcome["error"] = e
        thread = threading.Thread(target=failing_pull, daemon=True)
        thread.start()
        exporter.mark(["f"], 0)
        assert got_layer.wait(10)
        exporter.fail("f", "cancelled")
        thread.join(timeout=10)
        assert isinstance(outcome.get("error"), KvPrefillFailedError), outcome
        assert exporter.wait_released("f")

        pull("g", [4, 5], [1, 2], 11)            # a new link: one more handshake on each side, bytes still exact
        assert (handshakes(), exporter.stats()["mpi_handshakes"]) == (mine + 1, theirs + 1)
        importer.close()

    def test_ofi_netmod_pulls_are_bit_exact_and_a_netmod_mismatch_is_refused_at_once(exporters):
        """A process that loaded ucxx uses MPICH's ofi netmod (libfabric tcp): two such processes pull exactly;
        an ofi importer and this run's ucx exporters cannot connect, and the pull says so without waiting."""
        ofi = {**os.environ, "MPIR_CVAR_CH4_NETMOD": "ofi"}
        process = PrefillProcess(env=ofi)
        group = Exporters(process, f"trtpd_test_{os.getpid()}_ofi_")
        try:
            exporter = group.start("mpi", LAYOUT, num_blocks=8)
            exporter.register("o", [6, 2], 15)
            child = start_importer(group.key, exporter.complete("o", 4), [3, 1], env=ofi)
            assert outcome_lines(child) == ["done 4", f"digest {expected_digest(exporter, [6, 2], 15)}"]
            assert exporter.wait_released("o")
            group.close()
        finally:
            process.stop()
            for path in SHM_DIR.glob(f"{group.prefix}*"):
                path.unlink(missing_ok=True)
        ucx_exporter = exporters.start("mpi", LAYOUT, num_blocks=8)
        ucx_exporter.register("m", [0], 8)
        start_s = time.monotonic()
        child = start_importer(exporters.key, ucx_exporter.complete("m", 4), [0], env=ofi)
        [line] = outcome_lines(child)
        assert line.startswith("error KvConnectError") and "ucx netmod and this process ofi" in line, line
        assert time.monotonic() - start_s < 20                # (process start-up included; no handshake timeout)
        assert ucx_exporter.wait_released("m", timeout_s=5.0)

    def test_mpich_segment_of_this_process_is_unlinked_while_mapped():
        handshakes()    # MPI is up in this process
        with open("/proc/self/maps") as maps:
            mapped = {line.split(None, 5)[5].strip() for line in maps if "/dev/shm/mpich_" in line}
        assert mapped, "MPICH maps no /dev/shm segment: the unlinking in MpiWorld has nothing to do any more"
        assert all(path.endswith(" (deleted)") for path in mapped), mapped
        assert not any(Path(path.removesuffix(" (deleted)")).exists() for path in mapped), mapped
