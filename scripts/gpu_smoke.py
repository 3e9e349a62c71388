#!/usr/bin/env python3
"""GPU smoke test of trtpd's TensorRT-LLM 1.2.1 path, run inside the container on a box with 2+ GPUs.

    docker run --rm --gpus '"device=0,1"' --ipc=host -v $PWD:/trtpd -w /trtpd \
        nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 python3 scripts/gpu_smoke.py

1. writes a small random-weight Llama (2 layers, hidden 256) and a word-level tokenizer;
2. `trtpd build` for both roles (fp16, TP1/TP1: prefill on GPU 0, decode on GPU 1), which renders
   engines/<model>/deploy/ and lints it;
3. starts deploy/launch_triton.sh, sends 20 requests through the ensemble (15 whole, 5 streamed), checks
   each has exactly max_tokens output ids (min_length = max_tokens) and that streams arrive in pieces, and
   that MPI rank 1 (prefill) runs on GPU 0 and rank 2 (decode) on GPU 1; stops Triton;
4. the same against deploy/trtllm-serve/launch.sh through the router's /v1/completions, with
   usage.completion_tokens checked and each server on its own GPU.
Prints one `ok:` line per check and exits non-zero at the first failure. `--print-plan` prints every
command and request without running anything (what tests/unit/trtllm/test_gpu_smoke.py checks).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "smoke-llama"
WORDS = [f"w{i}" for i in range(500)]


@dataclass(frozen=True)
class SmokeConfig:
    work_dir: Path = Path("/tmp/trtpd-smoke")
    num_requests: int = 20
    num_streamed: int = 5
    max_tokens: int = 16
    max_input_len: int = 128
    max_output_len: int = 32
    http_port: int = 8000
    router_port: int = 8300
    first_worker_port: int = 8400
    ready_timeout_s: int = 900
    container: str = "auto"
    expected_gpus: dict = field(default_factory=lambda: {"prefill": 0, "decode": 1})

    @property
    def model_dir(self) -> Path:
        return self.work_dir / MODEL_NAME

    @property
    def engines_dir(self) -> Path:
        return self.work_dir / "engines"

    @property
    def deploy_dir(self) -> Path:
        return self.engines_dir / MODEL_NAME / "deploy"


def tiny_llama_config(vocab_size: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
            "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
            "vocab_size": vocab_size, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}


def vocab() -> dict[str, int]:
    return {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}


def write_tiny_llama(model_dir: Path) -> None:
    """Random weights (seeded) and a whitespace word-level tokenizer; needs torch, transformers, tokenizers."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    model_dir.mkdir(parents=True, exist_ok=True)
    config = tiny_llama_config(len(vocab()))
    LlamaForCausalLM(LlamaConfig(**config)).to(torch.float16).save_pretrained(model_dir)
    tok = Tokenizer(models.WordLevel(vocab=vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(model_dir)


def build_argv(cfg: SmokeConfig) -> list[str]:
    """`trtpd build` for both roles: fp16 (no calibration data needed), TP1 each, 1 instance each."""
    return ["build", "--model", str(cfg.model_dir), "--no-fp8", "--dtype", "float16", "--prefill-tp", "1",
            "--decode-tp", "1", "--prefill-instances", "1", "--decode-instances", "1",
            "--max-input-len", str(cfg.max_input_len), "--max-output-len", str(cfg.max_output_len),
            "--prefill-max-num-tokens", "256", "--decode-max-num-tokens", "256", "--gpus-per-node", "2",
            "--http-port", str(cfg.http_port), "--grpc-port", str(cfg.http_port + 1),
            "--metrics-port", str(cfg.http_port + 2), "--router-port", str(cfg.router_port),
            "--first-worker-port", str(cfg.first_worker_port), "--container", cfg.container,
            "--engines-dir", str(cfg.engines_dir), "--force"]


def prompt(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(8 + i % 5))


def triton_requests(cfg: SmokeConfig) -> list[tuple[str, dict, bool]]:
    """(url, JSON body, streamed) through the ensemble; min_length forces exactly max_tokens tokens."""
    base = f"http://localhost:{cfg.http_port}/v2/models/ensemble"
    out = []
    for i in range(cfg.num_requests):
        streamed = i >= cfg.num_requests - cfg.num_streamed
        body = {"text_input": prompt(i), "max_tokens": cfg.max_tokens, "min_length": cfg.max_tokens,
                "temperature": 0.0, "stream": streamed}
        out.append((f"{base}/generate_stream" if streamed else f"{base}/generate", body, streamed))
    return out


def serve_requests(cfg: SmokeConfig) -> list[tuple[str, dict, bool]]:
    url = f"http://localhost:{cfg.router_port}/v1/completions"
    out = []
    for i in range(cfg.num_requests):
        streamed = i >= cfg.num_requests - cfg.num_streamed
        out.append((url, {"model": MODEL_NAME, "prompt": prompt(i), "max_tokens": cfg.max_tokens,
                          "min_tokens": cfg.max_tokens, "ignore_eos": True, "temperature": 0.0, "stream": streamed},
                    streamed))
    return out


def launch_commands(cfg: SmokeConfig) -> dict[str, list[str]]:
    return {"triton": ["bash", str(cfg.deploy_dir / "launch_triton.sh")],
            "trtllm-serve": ["bash", str(cfg.deploy_dir / "trtllm-serve" / "launch.sh")]}


def ready_urls(cfg: SmokeConfig) -> dict[str, str]:
    return {"triton": f"http://localhost:{cfg.http_port}/v2/health/ready",
            "trtllm-serve": f"http://localhost:{cfg.router_port}/health"}


# ---- running (GPU box only) ----

def ok(message: str) -> None:
    print(f"ok: {message}", flush=True)


def fail(message: str) -> None:
    print(f"FAIL: {message}", flush=True)
    raise SystemExit(1)


def post(url: str, body: dict, streamed: bool, timeout_s: float = 120) -> list[dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        text = resp.read().decode()
    if not streamed:
        return [json.loads(text)]
    events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    return [json.loads(e) for e in events if e and e != "[DONE]"]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: int) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail(f"the server exited with {proc.returncode} before {url} was ready; see its log")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(5)
    fail(f"{url} not ready after {timeout_s} s")


def gpu_of_pids() -> dict[int, int]:
    """pid -> GPU index of every process that holds GPU memory (nvidia-smi)."""
    index = dict(line.split(", ") for line in subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,index", "--format=csv,noheader"], capture_output=True, text=True,
        check=True).stdout.split("\n") if line.strip())
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                          capture_output=True, text=True, check=True).stdout
    return {int(pid): int(index[uuid]) for pid, uuid in (line.split(", ") for line in apps.splitlines() if line)}


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def check_triton_placement(cfg: SmokeConfig) -> None:
    by_rank = {int(_environ(pid).get("OMPI_COMM_WORLD_RANK", -1)): gpu for pid, gpu in gpu_of_pids().items()}
    want = {1: cfg.expected_gpus["prefill"], 2: cfg.expected_gpus["decode"]}
    if {r: by_rank.get(r) for r in want} != want:
        fail(f"MPI ranks on GPUs {by_rank}, expected rank 1 (prefill) on GPU {want[1]}, rank 2 (decode) on {want[2]}")
    ok(f"prefill (rank 1) ran on GPU {want[1]}, decode (rank 2) on GPU {want[2]}")


def check_serve_placement(cfg: SmokeConfig) -> None:
    ports = {"prefill": cfg.first_worker_port, "decode": cfg.first_worker_port + 1}
    seen = {}
    for pid, gpu in gpu_of_pids().items():
        match = re.search(r"--port (\d+)", _cmdline(pid))
        for role, port in ports.items():
            if match and int(match.group(1)) == port:
                seen[role] = gpu
    if seen != cfg.expected_gpus:
        fail(f"trtllm-serve servers on GPUs {seen}, expected {cfg.expected_gpus}")
    ok(f"trtllm-serve prefill server on GPU {seen['prefill']}, decode server on GPU {seen['decode']}")


def check_triton_responses(cfg: SmokeConfig) -> None:
    for url, body, streamed in triton_requests(cfg):
        events = post(url, body, streamed)
        ids = [t for e in events for t in (e.get("output_ids") or [])]
        ids = [t for row in ids for t in (row if isinstance(row, list) else [row])]
        if len(ids) != cfg.max_tokens:
            fail(f"{url}: {len(ids)} output ids, expected {cfg.max_tokens} ({body['text_input']!r})")
        if streamed and len(events) < 2:
            fail(f"{url}: streamed request came back in {len(events)} event(s)")
    ok(f"{cfg.num_requests} requests through the ensemble: {cfg.max_tokens} tokens each, "
       f"{cfg.num_streamed} streamed in pieces")


def check_serve_responses(cfg: SmokeConfig) -> None:
    for url, body, streamed in serve_requests(cfg):
        events = post(url, body, streamed)
        if streamed:
            pieces = [c for e in events for c in e.get("choices", []) if c.get("text")]
            if len(pieces) < 2:
                fail(f"{url}: streamed completion came back in {len(pieces)} piece(s)")
        elif events[0]["usage"]["completion_tokens"] != cfg.max_tokens:
            fail(f"{url}: {events[0]['usage']['completion_tokens']} completion tokens, expected {cfg.max_tokens}")
    ok(f"{cfg.num_requests} requests through the trtllm-serve router: {cfg.max_tokens} tokens each, "
       f"{cfg.num_streamed} streamed in pieces")


def serve_path(cfg: SmokeConfig, name: str, check_responses, check_placement) -> None:
    log = open(cfg.work_dir / f"{name}.log", "w")
    proc = subprocess.Popen(launch_commands(cfg)[name], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(ready_urls(cfg)[name], proc, cfg.ready_timeout_s)
        ok(f"{name} ready")
        check_responses(cfg)
        check_placement(cfg)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def run_trtpd(argv: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = subprocess.run([sys.executable, "-c", "import sys; from trtpd.cli.main import main; sys.exit(main())",
                           *argv], env=env).returncode
    if code:
        fail(f"trtpd {' '.join(argv)} exited with {code}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work-dir", type=Path, default=SmokeConfig.work_dir)
    p.add_argument("--container", default="auto", choices=("auto", "triton-26.04", "trtllm-1.2.1"))
    p.add_argument("--print-plan", action="store_true", help="print the commands and requests; run nothing")
    p.add_argument("--skip-serve", action="store_true", help="only the Triton path")
    args = p.parse_args(argv)
    cfg = SmokeConfig(work_dir=args.work_dir, container=args.container)
    if args.print_plan:
        print(json.dumps({"build": build_argv(cfg), "launch": launch_commands(cfg), "ready": ready_urls(cfg),
                          "triton_requests": triton_requests(cfg), "serve_requests": serve_requests(cfg)}, indent=1))
        return 0
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    write_tiny_llama(cfg.model_dir)
    ok(f"random-weight Llama written to {cfg.model_dir}")
    run_trtpd(build_argv(cfg))
    ok(f"engines built and deploy folder rendered at {cfg.deploy_dir}")
    run_trtpd(["lint", str(cfg.engines_dir / MODEL_NAME), "--no-port-check"])
    ok("trtpd lint: no errors")
    serve_path(cfg, "triton", check_triton_responses, check_triton_placement)
    if not args.skip_serve:
        serve_path(cfg, "trtllm-serve", check_serve_responses, check_serve_placement)
    print("smoke: all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
