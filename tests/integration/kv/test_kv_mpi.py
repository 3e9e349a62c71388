"""The KV integration tests over the mpi transport, in a pytest process of their own.

ucxx and MPICH's UCX netmod cannot share a process (both are libucp.so.0, 1.19 and 1.20), and this process runs
the ucx tests, so the mpi ones run in a child pytest: every parametrised test of the four KV files with
transport mpi (bit-exact fp16 and fp8 pulls, layer-wise pulls, concurrent pulls, refused forged / stale /
mismatched / keyless handles, a peer killed mid-transfer) and test_kv_mpi_links.py (links, handshakes, /dev/shm).
After it, nothing of MPI may be left: no MPICH or libfabric segment in /dev/shm, no mpiexec placeholder still
running.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.kv.conftest import TRANSPORTS_ENV, transports_under_test
from trtpd.kv.pool import SHM_DIR

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent
FILES = ["test_kv_pull.py", "test_kv_pull_auth.py", "test_kv_refusals.py", "test_kv_peer_death.py",
         "test_kv_mpi_links.py"]
MARKER_ENV = "TRTPD_TEST_MPI_RUN"
MIN_TESTS = 22       # the mpi run has 17 parametrised tests and 5 of its own: fewer means a collection problem


def processes_with(marker: str) -> list[str]:
    """Processes (pid and command line) whose environment carries the run's marker."""
    found = []
    needle = f"{MARKER_ENV}={marker}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name}: {command}")
        except OSError:
            continue
    return found


if "mpi" not in transports_under_test():     # (in the mpi run itself, the files above are the tests)

    def test_every_kv_integration_test_passes_over_mpi_and_leaves_nothing_behind():
        marker = uuid.uuid4().hex
        env = {**os.environ, TRANSPORTS_ENV: "mpi", MARKER_ENV: marker, "PYTHONFAULTHANDLER": "1"}
        shm_before = set(os.listdir(SHM_DIR))
        start_s = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "mpi",
                               *[str(HERE / f) for f in FILES]], cwd=HERE.parents[2], env=env,
                              capture_output=True, text=True, timeout=300)
        took_s = time.monotonic() - start_s
        report = f"(mpi run: {took_s:.1f} s)\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
        assert proc.returncode == 0, report
        summary = proc.stdout.strip().splitlines()[-1]
        passed = re.search(r"(\d+) passed", summary)
        assert passed and int(passed.group(1)) >= MIN_TESTS, report
        assert not re.search(r"failed|error|skipped", summary), report
        deadline_s = time.monotonic() + 10       # the placeholders end once their processes are gone
        while processes_with(marker) and time.monotonic() < deadline_s:
            time.sleep(0.2)
        assert not processes_with(marker), processes_with(marker)
        left = sorted(name for name in set(os.listdir(SHM_DIR)) - shm_before     # MPICH's, libfabric shm's, ours
                      if name.startswith(("mpich_", "trtpd_test_")) or re.fullmatch(r"\d+:\d+:\d+", name))
        assert not left, f"left in /dev/shm by the mpi run: {left}"
