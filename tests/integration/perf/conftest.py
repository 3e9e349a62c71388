"""Shared by the tests that read the real AIConfigurator database through .venv-aic (they never skip)."""

from __future__ import annotations

import json
import subprocess

import pytest

from trtpd.errors import ConfigError
from trtpd.perf.aiconfigurator import aic_python


@pytest.fixture(scope="module")
def venv_python():
    try:
        return aic_python()
    except ConfigError as exc:
        pytest.fail(f"{exc}: these tests read the real AIConfigurator database and do not skip")


def run_oracle(venv_python, script: str, argument: str):
    """Runs `script` in .venv-aic with one argument; its last stdout line is JSON."""
    proc = subprocess.run([str(venv_python), "-c", script, argument], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
