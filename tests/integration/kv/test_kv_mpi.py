"""The KV integration tests over the mpi transport, in a pytest process of their own (see conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.kv.conftest import TRANSPORTS_ENV

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent
FILES = ["test_kv_pull.py", "test_kv_pull_auth.py", "test_kv_refusals.py", "test_kv_peer_death.py"]


@pytest.mark.skipif(os.environ.get(TRANSPORTS_ENV) == "mpi", reason="already the mpi run")
def test_every_kv_integration_test_passes_over_mpi():
    env = {**os.environ, TRANSPORTS_ENV: "mpi"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "mpi",
                           *[str(HERE / f) for f in FILES]], cwd=HERE.parents[2], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout.splitlines()[-1]
