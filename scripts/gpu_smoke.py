#!/usr/bin/env python3
"""GPU smoke test of trtpd's TensorRT-LLM 1.2.1 path: what a first GPU deployment must show.

Run inside the container on a box with 2+ GPUs (docs/containers.md says which image and why):

    docker run --rm --gpus '"device=0,1"' --ipc=host -v $PWD:/trtpd -w /trtpd \
        nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 python3 scripts/gpu_smoke.py

1. the image's tensorrt_llm and tensorrt versions are printed and must be the pinned ones;
2. writes a small Llama whose greedy continuation is known by construction (a "successor chain": word i
   is followed by word i+1, and word 100k+99 by </s>; random attention and MLP, scaled down) and a
   word-level tokenizer, and checks with transformers that it continues every prompt as designed;
3. `trtpd build` for both roles (fp16, TP1/TP1: prefill on GPU 0, decode on GPU 1), renders and lints;
4. Triton (deploy/launch_triton.sh), through the ensemble, each request whole and streamed:
   - without end_id a request stops at EOS (</s>, which the engine does not emit) before max_tokens;
   - with end_id one stops early (the end_id token not emitted) and without an error;
   - a request whose chain is longer than max_tokens stops at max_tokens;
   - every output is the designed token ids, and the streamed text equals the whole text;
   - KV moved between the roles: the prefill and the decode model each served every request, none failed;
   - prefill (MPI rank 1) ran on GPU 0, decode (rank 2) on GPU 1;
5. the same for trtllm-serve (deploy/trtllm-serve/launch.sh) through the router's /v1/completions, with
   stop_token_ids in place of end_id, and KV moved by hand: a context_only request to the context server,
   then generation_only to the generation server with the handle it returned, gives the router's text.
Prints one `ok:` line per check and exits non-zero at the first failure. `--print-plan` prints every command
and request without running anything (what tests/unit/trtllm/test_gpu_smoke.py checks).
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
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "smoke-llama"
SPECIAL = {"<unk>": 0, "<s>": 1, "</s>": 2}
EOS_ID = SPECIAL["</s>"]
NUM_WORDS = 500
CHAIN = 100                 # word 100k+99 is followed by </s>; every other word i by word i+1
HIDDEN = 512


def word_id(i: int) -> int:
    return len(SPECIAL) + i


def successor(token_id: int) -> int:
    """The token the smoke model predicts after token_id (specials lead to word 0)."""
    i = token_id - len(SPECIAL)
    if i < 0:
        return word_id(0)
    return EOS_ID if i % CHAIN == CHAIN - 1 else word_id(i + 1)


def continuation(last_id: int, max_tokens: int, stop_id: int | None = None) -> list[int]:
    """Greedy output after a prompt ending in last_id: EOS and stop_id end it and are not emitted."""
    out, token = [], last_id
    while len(out) < max_tokens:
        token = successor(token)
        if token in (EOS_ID, stop_id):
            break
        out.append(token)
    return out


@dataclass(frozen=True)
class Case:
    """One prompt with its designed outcome; each is sent whole and streamed."""
    kind: str                       # "eos", "end_id" or "length"
    prompt_ids: tuple[int, ...]
    stop_id: int | None             # end_id (Triton) / stop_token_ids (trtllm-serve)
    expected_ids: tuple[int, ...]


@dataclass(frozen=True)
class SmokeConfig:
    work_dir: Path = Path("/tmp/trtpd-smoke")
    prompts_per_kind: int = 4
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

    @property
    def metrics_port(self) -> int:
        return self.http_port + 2


def smoke_cases(cfg: SmokeConfig) -> list[Case]:
    """eos: ends 5 words before its chain's </s>; length and end_id: 89 words before, longer than max_tokens;
    end_id stops at the 4th word. Words before the last one come from other chains."""
    cases = []
    for n in range(cfg.prompts_per_kind):
        filler = tuple(word_id((CHAIN * (n + 2) + 7 * k) % NUM_WORDS) for k in range(3 + n))
        eos_last, long_last = word_id(CHAIN * n + CHAIN - 6), word_id(CHAIN * n + 10)
        stop = word_id(CHAIN * n + 14)
        cases += [Case("eos", filler + (eos_last,), None, tuple(continuation(eos_last, cfg.max_tokens))),
                  Case("length", filler + (long_last,), None, tuple(continuation(long_last, cfg.max_tokens))),
                  Case("end_id", filler + (long_last,), stop, tuple(continuation(long_last, cfg.max_tokens, stop)))]
    return cases


def vocab() -> dict[str, int]:
    return {**SPECIAL, **{f"w{i}": word_id(i) for i in range(NUM_WORDS)}}


def text_of(ids) -> str:
    names = {v: k for k, v in vocab().items()}
    return " ".join(names[i] for i in ids)


def tiny_llama_config(vocab_size: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
            "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 8,
            "num_key_value_heads": 8, "vocab_size": vocab_size, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float16", "bos_token_id": 1,
            "eos_token_id": EOS_ID, "tie_word_embeddings": False}


def chain_weights(vocab_size: int, hidden: int = HIDDEN, seed: int = 0):
    """(embedding, lm_head): random embeddings; lm_head row j is the sum of the unit embeddings of the tokens
    whose successor is j, so the logits of a token's own embedding peak at its successor."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(vocab_size, hidden, generator=gen)
    unit = embed / embed.norm(dim=1, keepdim=True)
    lm_head = torch.zeros(vocab_size, hidden)
    for token in range(vocab_size):
        lm_head[successor(token)] += unit[token]
    return embed, lm_head


def write_tiny_llama(model_dir: Path) -> None:
    """The chain model (attention and MLP outputs scaled by 0.1, so the residual stays the token's own
    embedding) and a whitespace word-level tokenizer; needs torch, transformers, tokenizers."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    model_dir.mkdir(parents=True, exist_ok=True)
    model = LlamaForCausalLM(LlamaConfig(**tiny_llama_config(len(vocab()))))
    embed, lm_head = chain_weights(len(vocab()))
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(lm_head)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
    model.to(torch.float16).save_pretrained(model_dir)
    tok = Tokenizer(models.WordLevel(vocab=vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(model_dir)


def check_model_as_designed(cfg: SmokeConfig) -> None:
    """transformers' greedy output of the written checkpoint is the designed one for every case."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(cfg.model_dir, torch_dtype=torch.float32).eval()
    for case in smoke_cases(cfg):
        prompt = torch.tensor([case.prompt_ids])
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=cfg.max_tokens,
                                 do_sample=False, eos_token_id=[EOS_ID] + ([case.stop_id] if case.stop_id else []),
                                 pad_token_id=EOS_ID)
        got = [t for t in out[0, len(case.prompt_ids):].tolist() if t not in (EOS_ID, case.stop_id)]
        if tuple(got) != case.expected_ids:
            fail(f"the smoke model continues {text_of(case.prompt_ids)!r} with {text_of(got)!r}, designed "
                 f"{text_of(case.expected_ids)!r}; the checkpoint is wrong, not the server")
    ok(f"transformers continues all {len(smoke_cases(cfg))} prompts as designed (EOS after 5 words, end_id after 3, "
       f"{cfg.max_tokens} words without either)")


def build_argv(cfg: SmokeConfig) -> list[str]:
    """`trtpd build` for both roles: fp16 (no calibration data needed), TP1 each, 1 instance each."""
    return ["build", "--model", str(cfg.model_dir), "--no-fp8", "--dtype", "float16", "--prefill-tp", "1",
            "--decode-tp", "1", "--prefill-instances", "1", "--decode-instances", "1",
            "--max-input-len", str(cfg.max_input_len), "--max-output-len", str(cfg.max_output_len),
            "--prefill-max-num-tokens", "256", "--decode-max-num-tokens", "256", "--gpus-per-node", "2",
            "--http-port", str(cfg.http_port), "--grpc-port", str(cfg.http_port + 1),
            "--metrics-port", str(cfg.metrics_port), "--router-port", str(cfg.router_port),
            "--first-worker-port", str(cfg.first_worker_port), "--container", cfg.container,
            "--engines-dir", str(cfg.engines_dir), "--force"]


def triton_requests(cfg: SmokeConfig) -> list[tuple[str, dict, bool, Case]]:
    """(url, JSON body, streamed, case) through the ensemble: greedy (top_k 1), no min_length, end_id only
    for the end_id cases (the others rely on the tokenizer's EOS, as a client would)."""
    base = f"http://localhost:{cfg.http_port}/v2/models/ensemble"
    out = []
    for case in smoke_cases(cfg):
        for streamed in (False, True):
            body = {"text_input": text_of(case.prompt_ids), "max_tokens": cfg.max_tokens, "top_k": 1,
                    "stream": streamed}
            if case.stop_id is not None:
                body["end_id"] = case.stop_id
            out.append((f"{base}/generate_stream" if streamed else f"{base}/generate", body, streamed, case))
    return out


def serve_requests(cfg: SmokeConfig) -> list[tuple[str, dict, bool, Case]]:
    """The same through the trtllm-serve router; stop_token_ids is its end_id (the stop token not emitted)."""
    url = f"http://localhost:{cfg.router_port}/v1/completions"
    out = []
    for case in smoke_cases(cfg):
        for streamed in (False, True):
            body = {"model": MODEL_NAME, "prompt": text_of(case.prompt_ids), "max_tokens": cfg.max_tokens,
                    "top_k": 1, "stream": streamed}
            if case.stop_id is not None:
                body["stop_token_ids"] = [case.stop_id]
            out.append((url, body, streamed, case))
    return out


def launch_commands(cfg: SmokeConfig) -> dict[str, list[str]]:
    return {"triton": ["bash", str(cfg.deploy_dir / "launch_triton.sh")],
            "trtllm-serve": ["bash", str(cfg.deploy_dir / "trtllm-serve" / "launch.sh")]}


def ready_urls(cfg: SmokeConfig) -> dict[str, str]:
    return {"triton": f"http://localhost:{cfg.http_port}/v2/health/ready",
            "trtllm-serve": f"http://localhost:{cfg.router_port}/health"}


VERSION_PROBE = ("import json, tensorrt, tensorrt_llm; "
                 "print(json.dumps({'tensorrt_llm': tensorrt_llm.__version__, 'tensorrt': tensorrt.__version__}))")


# ---- running (GPU box only) ----

def ok(message: str) -> None:
    print(f"ok: {message}", flush=True)


def fail(message: str) -> None:
    print(f"FAIL: {message}", flush=True)
    raise SystemExit(1)


def post(url: str, body: dict, streamed: bool, timeout_s: float = 120) -> list[dict]:
    """The response events; an HTTP error or an error event fails the smoke with the server's words."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            text = resp.read().decode()
    except urllib.error.HTTPError as exc:
        fail(f"{url} answered {exc.code}: {exc.read().decode(errors='replace')[:500]} ({body})")
    events = [json.loads(text)] if not streamed else [
        json.loads(e) for e in (line[5:].strip() for line in text.splitlines() if line.startswith("data:"))
        if e and e != "[DONE]"]
    errors = [e["error"] for e in events if "error" in e]
    if errors:
        fail(f"{url}: the request ended with an error: {errors[0]} ({body})")
    return events


def check_versions() -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from trtpd.trtllm.versions import PINNED, same_tensorrt

    out = subprocess.run([sys.executable, "-c", VERSION_PROBE], capture_output=True, text=True)
    if out.returncode:
        fail(f"tensorrt_llm/tensorrt do not import in this image: {out.stderr.strip()[-500:]}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    triton = os.environ.get("TRITON_SERVER_VERSION", "none")
    if found["tensorrt_llm"] != PINNED.tensorrt_llm or not same_tensorrt(found["tensorrt"]):
        fail(f"this image has TensorRT-LLM {found['tensorrt_llm']} with TensorRT {found['tensorrt']}; trtpd is "
             f"pinned to {PINNED.tensorrt_llm} with {PINNED.tensorrt} (docs/containers.md says which image ships it)")
    ok(f"image: TensorRT-LLM {found['tensorrt_llm']}, TensorRT {found['tensorrt']}, Triton server {triton}")


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


def triton_output(events: list[dict]) -> tuple[list[int], str]:
    ids = [t for e in events for t in (e.get("output_ids") or [])]
    ids = [t for row in ids for t in (row if isinstance(row, list) else [row])]
    text = "".join(t for e in events for t in ([e["text_output"]] if isinstance(e.get("text_output"), str)
                                               else e.get("text_output") or []))
    return ids, text


def serve_output(events: list[dict]) -> tuple[list[int] | None, str]:
    choices = [c for e in events for c in e.get("choices", [])]
    ids = [t for c in choices for t in (c.get("token_ids") or [])] or None
    return ids, "".join(c.get("text") or "" for c in choices)


def check_responses(cfg: SmokeConfig, requests, output, path: str) -> None:
    """Each case: the designed ids (where the answer carries them), the designed words, streamed == whole."""
    whole: dict[Case, str] = {}
    for url, body, streamed, case in requests:
        events = post(url, body, streamed)
        ids, text = output(events)
        if ids is not None and tuple(ids) != case.expected_ids:
            fail(f"{path} {case.kind}: output ids {ids}, designed {list(case.expected_ids)} ({body})")
        if text.split() != text_of(case.expected_ids).split():
            fail(f"{path} {case.kind}: text {text!r}, designed {text_of(case.expected_ids)!r} ({body})")
        if streamed and case.kind == "length" and len(events) < 2:
            fail(f"{path}: a streamed request came back in {len(events)} event(s)")
        if streamed and text != whole[case]:
            fail(f"{path} {case.kind}: streamed text {text!r} differs from the whole text {whole[case]!r}")
        whole.setdefault(case, text)
    ok(f"{path}: without end_id each request stopped at EOS after 5 tokens, with end_id after 3 without an error, "
       f"otherwise at max_tokens {cfg.max_tokens}; whole and streamed, and the streamed text equals the whole text")


def metric_values(url: str, name: str) -> dict[str, float]:
    """{model label: value} of one Prometheus family on Triton's metrics endpoint."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        match = re.match(rf'^{name}\{{(.*)\}} (\S+)$', line)
        model = match and re.search(r'model="([^"]+)"', match.group(1))
        if model:
            values[model.group(1)] = float(match.group(2))
    return values


def triton_role_counts(cfg: SmokeConfig) -> dict[str, float]:
    url = f"http://localhost:{cfg.metrics_port}/metrics"
    success, failure = (metric_values(url, f"nv_inference_request_{k}") for k in ("success", "failure"))
    return {f"{role} {k}": table.get(role, 0.0) for role in ("prefill", "decode")
            for k, table in (("success", success), ("failure", failure))}


def check_triton(cfg: SmokeConfig) -> None:
    """The responses, then KV moved: every request reached the prefill model (context_only) and the decode
    model (generation_only, which runs only on the KV it pulls from prefill), and none failed there."""
    before = triton_role_counts(cfg)
    requests = triton_requests(cfg)
    check_responses(cfg, requests, triton_output, "triton")
    want = {f"{role} success": len(requests) for role in ("prefill", "decode")}
    want.update({f"{role} failure": 0 for role in ("prefill", "decode")})
    deadline = time.monotonic() + 15
    while True:
        delta = {k: v - before[k] for k, v in triton_role_counts(cfg).items()}
        if delta == want or time.monotonic() > deadline:
            break
        time.sleep(1)
    if delta != want:
        fail(f"Triton's per-model request counts moved by {delta}, expected {want}")
    ok(f"KV moved: prefill and decode each served all {len(requests)} requests (nv_inference_request_success), "
       f"none failed")


def check_serve(cfg: SmokeConfig) -> None:
    """The responses through the router, then one request by hand: context_only to the context server,
    generation_only with its disaggregated_params to the generation server."""
    check_responses(cfg, serve_requests(cfg), serve_output, "trtllm-serve")
    case = next(c for c in smoke_cases(cfg) if c.kind == "length")
    body = {"model": MODEL_NAME, "prompt": text_of(case.prompt_ids), "max_tokens": cfg.max_tokens, "top_k": 1}
    ctx = post(f"http://localhost:{cfg.first_worker_port}/v1/completions",
               {**body, "disaggregated_params": {"request_type": "context_only"}}, False)[0]
    params = {k: v for k, v in (ctx["choices"][0].get("disaggregated_params") or {}).items() if v is not None}
    if not params.get("encoded_opaque_state") and params.get("ctx_request_id") is None:
        fail(f"the context server returned no handle: {ctx['choices'][0]}")
    gen = post(f"http://localhost:{cfg.first_worker_port + 1}/v1/completions",
               {**body, "disaggregated_params": {**params, "request_type": "generation_only"}}, False)
    _, text = serve_output(gen)
    if text.split() != text_of(case.expected_ids).split():
        fail(f"generation_only on the context server's handle gave {text!r}, designed {text_of(case.expected_ids)!r}")
    ok("KV moved: the generation server continued a context_only request from its handle (ctx_request_id "
       f"{params.get('ctx_request_id')}) with the designed text")


def gpu_of_pids() -> dict[int, int]:
    """pid -> GPU index of every process that holds GPU memory (nvidia-smi)."""
    index = dict(line.split(", ") for line in subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,index", "--format=csv,noheader"], capture_output=True, text=True,
        check=True).stdout.split("\n") if line.strip())
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                          capture_output=True, text=True, check=True).stdout
    return {int(pid): int(index[uuid]) for pid, uuid in (line.split(", ") for line in apps.splitlines() if line)}


def _proc_text(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def check_triton_placement(cfg: SmokeConfig) -> None:
    ranks = {}
    for pid, gpu in gpu_of_pids().items():
        env = dict(i.decode(errors="replace").split("=", 1) for i in _proc_text(pid, "environ").split(b"\0") if b"=" in i)
        ranks[int(env.get("OMPI_COMM_WORLD_RANK", -1))] = gpu
    want = {1: cfg.expected_gpus["prefill"], 2: cfg.expected_gpus["decode"]}
    if {r: ranks.get(r) for r in want} != want:
        fail(f"MPI ranks on GPUs {ranks}, expected rank 1 (prefill) on GPU {want[1]}, rank 2 (decode) on {want[2]}")
    ok(f"prefill (rank 1) ran on GPU {want[1]}, decode (rank 2) on GPU {want[2]}")


def check_serve_placement(cfg: SmokeConfig) -> None:
    ports = {"prefill": cfg.first_worker_port, "decode": cfg.first_worker_port + 1}
    seen = {}
    for pid, gpu in gpu_of_pids().items():
        match = re.search(r"--port (\d+)", _proc_text(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace"))
        for role, port in ports.items():
            if match and int(match.group(1)) == port:
                seen[role] = gpu
    if seen != cfg.expected_gpus:
        fail(f"trtllm-serve servers on GPUs {seen}, expected {cfg.expected_gpus}")
    ok(f"trtllm-serve prefill server on GPU {seen['prefill']}, decode server on GPU {seen['decode']}")


def serve_path(cfg: SmokeConfig, name: str, check, check_placement) -> None:
    log = open(cfg.work_dir / f"{name}.log", "w")
    proc = subprocess.Popen(launch_commands(cfg)[name], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(ready_urls(cfg)[name], proc, cfg.ready_timeout_s)
        ok(f"{name} ready")
        check(cfg)
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


def has_tritonserver() -> bool:
    return Path("/opt/tritonserver/bin/tritonserver").is_file()


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
                          "triton_requests": [r[:3] for r in triton_requests(cfg)],
                          "serve_requests": [r[:3] for r in serve_requests(cfg)]}, indent=1))
        return 0
    check_versions()
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    write_tiny_llama(cfg.model_dir)
    ok(f"chain-model Llama written to {cfg.model_dir}")
    check_model_as_designed(cfg)
    run_trtpd(build_argv(cfg))
    ok(f"engines built and deploy folder rendered at {cfg.deploy_dir}")
    run_trtpd(["lint", str(cfg.engines_dir / MODEL_NAME), "--no-port-check"])
    ok("trtpd lint: no errors")
    if has_tritonserver():
        serve_path(cfg, "triton", check_triton, check_triton_placement)
    else:
        print("skip: the Triton path (this image has no /opt/tritonserver; docs/containers.md)", flush=True)
    if not args.skip_serve:
        serve_path(cfg, "trtllm-serve", check_serve, check_serve_placement)
    print("smoke: all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
