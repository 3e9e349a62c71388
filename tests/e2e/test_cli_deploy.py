"""`trtpd up`, `status`, `bench` and `down` as a user runs them (separate processes, real server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def trtpd(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtpd.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_up_status_bench_down(tmp_path, fp16_root):
    env = {**os.environ, "TRTPD_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    up = trtpd("up", "--name", "cli", "--engines", str(fp16_root), env=env)
    assert up.returncode == 0, up.stderr
    assert "ready: cli (disaggregated)" in up.stdout and "gRPC     127.0.0.1:" in up.stdout
    try:
        again = trtpd("up", "--name", "cli", "--engines", str(fp16_root), env=env)
        assert again.returncode == 2 and "already running" in again.stderr
        status = trtpd("status", env=env)
        assert "cli" in status.stdout and "ready" in status.stdout and "prefill 0/1024" in status.stdout
        one = trtpd("status", "--name", "cli", "--json", env=env)
        rows = json.loads(one.stdout)
        assert [(r["name"], r["state"], r["death"]) for r in rows] == [("cli", "ready", None)], one.stdout
        # each role's engine verified batch invariance at load up to its max_num_tokens (metric, then status)
        assert rows[0]["batch_invariance_rows"] == {"prefill": 4096, "decode": 32}, one.stdout
        assert "batch invariance verified at load for forward passes up to decode 32 rows, prefill 4096 rows" \
            in status.stdout
        trace = tmp_path / "trace.csv"
        bench = trtpd("bench", "--name", "cli", "--num-requests", "6", "--rate", "4", "--trace", str(trace), env=env)
        assert bench.returncode == 0, bench.stdout + bench.stderr
        assert len(trace.read_text().splitlines()) == 7
    finally:
        down = trtpd("down", "--name", "cli", env=env)
    assert down.returncode == 0 and "stopped cli" in down.stdout
    assert "no deployments" in trtpd("status", env=env).stdout
    assert trtpd("down", "--name", "cli", env=env).returncode == 2


def test_fleet_up_prints_the_openai_url_and_down_stops_every_process(tmp_path, fp16_root):
    import re

    import openai

    from trtpd.process_identity import is_running

    env = {**os.environ, "TRTPD_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    up = trtpd("up", "--fleet", "--prefill", "1", "--decode", "1", "--name", "fl", "--engines", str(fp16_root), env=env)
    assert up.returncode == 0, up.stderr
    try:
        url = re.search(r"OpenAI API\s+(http://127\.0\.0\.1:\d+/v1)", up.stdout).group(1)
        key = re.search(r"API key\s+(sk-trtpd-\S+)\s+\(shown once", up.stdout).group(1)   # printed once
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        reply = openai.OpenAI(base_url=url, api_key=key, max_retries=0).completions.create(
            model="tiny-llama", prompt="Hello", max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3
        rows = json.loads(trtpd("status", "--name", "fl", "--json", env=env).stdout)
        fleet = next(r for r in rows if r.get("kind") == "fleet")
        assert [i["state"] for i in fleet["instances"]] == ["ready", "ready"] and fleet["gateway"]["port"]
        pids = [(i["pid"], i["start_time"]) for i in fleet["instances"]]
        pids.append((fleet["gateway"]["pid"], fleet["gateway"]["start_time"]))
        assert fleet["supervisor"]["running"]
        pids.append((fleet["supervisor"]["pid"], fleet["supervisor"]["start_time"]))
    finally:
        down = trtpd("down", "--name", "fl", env=env)
    assert down.returncode == 0, down.stderr
    assert not [p for p in pids if is_running(*p)]    # both instances, the gateway and its supervisord
