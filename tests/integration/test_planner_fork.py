"""The planner's two-process search (trtpd/planner/parallel.py), checked in a fresh interpreter: the cases are in
planner_fork_cases.py, each with its own assertion; this test runs them where no other thread exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_fork_cases_pass_in_a_process_running_no_other_thread():
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/integration/planner_fork_cases.py"], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(r"\b8 passed\b", out.stdout), out.stdout[-2000:]
