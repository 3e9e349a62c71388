"""`trtpd up --fleet --backend trtllm-serve --gpus ...`: real trtllm-serve workers, one per GPU set, as `trtpd build`'s
serve-pytorch/ starts them (fleet/gpu_workers.py). Here the command is pointed at the CPU twin, which takes
trtllm-serve's command line: each worker must get its own CUDA_VISIBLE_DEVICES, the rendered flags, a request through
the gateway must succeed, and `trtpd down` must stop every process. The GPU-marked test runs real trtllm-serve."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from trtpd.cli.main import main

pytestmark = pytest.mark.e2e
SMOKE = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke.py"


def trtpd(home: Path, *argv: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRTPD_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "trtpd.cli.main", *argv], env=env, text=True, capture_output=True,
                          timeout=timeout_s)


def environ(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(i.decode().split("=", 1) for i in items if b"=" in i)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def fleet_on_gpus(home: Path, serve_dir: Path, gpus: str, command: str, timeout_s: float) -> dict:
    """Starts the fleet, hands back its fleet.json; stops it (by pid, checked) when the caller's block ends."""
    up = trtpd(home, "up", "--fleet", "--backend", "trtllm-serve", "--prefill", "1", "--decode", "1", "--gpus", gpus,
               "--serve-dir", str(serve_dir), "--serve-command", command, "--no-auth", "--name", "gpus",
               timeout_s=timeout_s)
    assert up.returncode == 0, up.stdout + up.stderr
    return json.loads((home / "deployments" / "gpus" / "fleet.json").read_text())


def stop_and_check(home: Path, fleet: dict) -> None:
    pids = [i["server"]["pid"] for i in fleet["instances"]] + [fleet["gateway"]["pid"]]
    down = trtpd(home, "down", "--name", "gpus")
    assert down.returncode == 0, down.stdout + down.stderr
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]


def completion(fleet: dict, prompt: str, max_tokens: int) -> dict:
    gw = fleet["gateway"]
    resp = httpx.post(f"http://{gw['host']}:{gw['port']}/v1/completions", timeout=300,
                      json={"model": fleet["instances"][0]["model"], "prompt": prompt, "max_tokens": max_tokens})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_each_worker_gets_its_gpu_set_and_the_rendered_command(fp16_root, tmp_path):
    engines = tmp_path / "gpu-engines"
    assert main(["build", "--model", "tiny-llama", "--configs-only", "--no-fp8", "--hf-model",
                 str(fp16_root / "checkpoint"), "--engines-dir", str(engines)]) == 0
    serve_dir = engines / "tiny-llama" / "deploy" / "serve-pytorch"
    home = tmp_path / "home"
    fleet = fleet_on_gpus(home, serve_dir, "0,1", f"{sys.executable} -m trtpd.serve_twin", 300)
    try:
        by_role = {i["role"]: i for i in fleet["instances"]}
        assert {r: i["gpus"] for r, i in by_role.items()} == {"decode": [0], "prefill": [1]}
        for role, inst in by_role.items():
            env = environ(inst["server"]["pid"])
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, inst["gpus"]))
            assert env["TRTPD_KV_KEY_FILE"] == fleet["key_file"]
            log = Path(inst["server"]["log_path"]).read_text()
            command = next(line for line in log.splitlines() if line.startswith("$ "))
            assert f"-m trtpd.serve_twin {fp16_root / 'checkpoint'} --backend pytorch" in command
            assert {"--tp_size 1", f"--server_role {'CONTEXT' if role == 'prefill' else 'GENERATION'}",
                    "--host 127.0.0.1"} <= {" ".join(p) for p in zip(command.split(), command.split()[1:])}
            assert "--twin_key_file" not in command and "--disagg_cluster_uri" not in command
            assert "--tp_size: accepted as trtllm-serve's and ignored by the twin" in log
        assert fleet["tokenizer_dir"] == str(serve_dir.parent / "tokenizer")
        body = completion(fleet, "The quick brown fox", 8)
        assert body["usage"]["completion_tokens"] == 8 and body["choices"][0]["text"]
    finally:
        stop_and_check(home, fleet)


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    from trtpd.fleet.gpus import gpus_from_listing
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len(gpus_from_listing(out.stdout))


@pytest.mark.gpu
@pytest.mark.trtllm
@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is None or _gpu_count() < 2,
                    reason="needs TensorRT-LLM 1.2.1 (trtllm-serve) on a box with 2 GPUs")
def test_real_trtllm_serve_workers_on_two_gpus(tmp_path):
    """scripts/gpu_smoke.py's tiny Llama (a real Hugging Face checkpoint), served by real trtllm-serve on GPUs 0
    and 1 behind the gateway."""
    spec = importlib.util.spec_from_file_location("gpu_smoke", SMOKE)
    smoke = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = smoke
    try:
        spec.loader.exec_module(smoke)
        model = tmp_path / "tiny-llama-hf"
        smoke.write_tiny_llama(model)
    finally:
        sys.modules.pop("gpu_smoke", None)
    engines = tmp_path / "engines"
    assert main(["build", "--model", str(model), "--configs-only", "--no-fp8", "--dtype", "float16",
                 "--prefill-tp", "1", "--decode-tp", "1", "--engines-dir", str(engines)]) == 0
    serve_dir = next(engines.glob("*/deploy/serve-pytorch"))
    home = tmp_path / "home"
    fleet = fleet_on_gpus(home, serve_dir, "0,1", "trtllm-serve", 1200)
    try:
        assert sorted(sum((i["gpus"] for i in fleet["instances"]), [])) == [0, 1]
        assert completion(fleet, "a b c", 4)["usage"]["completion_tokens"] >= 1
    finally:
        stop_and_check(home, fleet)
