"""The published-result benchmarks run end to end (small settings; the numbers are in their output)."""

import runpy
import sys

import pytest


def _run(path, argv, capsys):
    old = sys.argv
    sys.argv = [path, *argv]
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = old
    return capsys.readouterr().out


def test_distserve_chatbot_benchmark_runs(capsys):
    out = _run("benchmarks/distserve_chatbot.py", ["--requests", "300", "--max-gpus", "8", "--top", "2"], capsys)
    assert "vLLM-0.2-style colocated (prefill-first)" in out and "within 8 GPUs, the analytic pick" in out
    assert "best disaggregated / vLLM-style colocated:" in out


@pytest.mark.parametrize("argv", [["--no-colocated", "--verify-requests", "400"]])
def test_seed004_deepseek_benchmark_runs(argv, capsys):
    out = _run("benchmarks/seed004_deepseek.py", argv, capsys)
    assert "1. seed formula, seed's inputs" in out and "3P4D" in out
    assert "3. trtpd plan" in out and "deepseek-v3.1 on h200" in out
