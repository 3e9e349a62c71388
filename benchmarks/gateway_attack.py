"""The gateway-under-attack probes (issue 19), run against a 1P+1D fleet that `trtpd up --fleet` starts, through
the CLI only, so the same script measures this checkout and an older one (run it with that checkout's trtpd on
PATH and its engines). Loopback only; every probe is bounded in count and time; the fleet is stopped at the end.

    .venv/bin/python benchmarks/gateway_attack.py --engines ENGINES/tiny-llama/reference-fp16

Prints one line per probe: the loop stall from one long word, requests served while twice the connection bound
(or, for a gateway without one, 7,000 idle connections) is held under an open-file limit of 4,096, the gateway's
RSS under a chunked 40 MiB body, the peak queue of a 1,000-request burst, the gateway's restart after SIGKILL,
and the KV release time for 100 clients gone before their first token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

FD_LIMIT = 4096


def trtpd(*args: str, env: dict, limit: int | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("trtpd", path=env["PATH"])
    pre = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))) if limit else None
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=600, preexec_fn=pre)


def get(url: str, key: str | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:   # refused, reset, timed out: no answer
        return -1, b""


def post(port: int, key: str | None, body: dict, timeout: float = 120.0) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1


class Poll:
    """GET /health every 20 ms; the slowest answer and the last `queued` value seen."""

    def __init__(self, port: int) -> None:
        self.port, self.slowest_s, self.peak_queued, self.stop = port, 0.0, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            status, body = get(f"http://127.0.0.1:{self.port}/health", timeout=300)
            self.slowest_s = max(self.slowest_s, time.monotonic() - t0)
            try:
                self.peak_queued = max(self.peak_queued, int(json.loads(body).get("queued", 0)))
            except ValueError:
                pass
            time.sleep(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=310)


def rss_mb(pid: int, field: str) -> float:
    return int(re.search(rf"^{field}:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M).group(1)) / 1024


def probe_word(port: int, key: str | None) -> str:
    with Poll(port) as poll:
        t0 = time.monotonic()
        # a word whose pieces keep merging: the hand-written BPE scanned it once per merge (quadratic)
        status = post(port, key, {"model": "tiny-llama", "prompt": ("requests" * 2003)[:16_019], "max_tokens": 1})
        took = time.monotonic() - t0
    return f"one 16,019-character word: {status} in {took:.2f} s; /health's slowest answer meanwhile {poll.slowest_s:.3f} s"


def probe_idle(port: int, key: str | None, gateway_pid: int, log: Path, num_idle: int) -> str:
    size0 = log.stat().st_size if log.is_file() else 0
    idle = []
    for _ in range(num_idle):
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    served = sum(post(port, key, {"model": "tiny-llama", "prompt": f"hi {i}", "max_tokens": 2}, timeout=10) == 200
                 for i in range(20))
    health, _ = get(f"http://127.0.0.1:{port}/health", timeout=10)
    for s in idle:
        s.close()
    grown = (log.stat().st_size - size0) / 1e6 if log.is_file() else float("nan")
    return (f"{len(idle)} idle connections held (open-file limit {FD_LIMIT}): {served}/20 requests served, /health "
            f"{health}; gateway log grew {grown:.2f} MB")


def probe_body(port: int, key: str | None, pid: int) -> str:
    before = rss_mb(pid, "VmRSS")
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: "
              b"chunked\r\n" + (f"Authorization: Bearer {key}\r\n".encode() if key else b"") + b"\r\n")
    chunk = b"%x\r\n" % (1 << 20) + b"a" * (1 << 20) + b"\r\n"
    try:
        for _ in range(40):
            s.sendall(chunk)
        s.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    try:
        answer = s.recv(100)
    except OSError:
        answer = b""
    s.close()
    return (f"chunked 40 MiB body: {answer[:12].decode(errors='replace')!r}; gateway RSS {before:.0f} MB before, peak "
            f"{rss_mb(pid, 'VmHWM'):.0f} MB, {rss_mb(pid, 'VmRSS'):.0f} MB after")


def probe_burst(port: int, key: str | None, n: int = 1000) -> str:
    import httpx

    async def go():
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=300,
                                     headers=headers) as c:
            body = {"model": "tiny-llama", "prompt": "The burst", "max_tokens": 8, "ignore_eos": True}
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(n)),
                                        return_exceptions=True)
    with Poll(port) as poll:
        answers = asyncio.run(go())
    codes = [str(a.status_code) if not isinstance(a, Exception) else type(a).__name__ for a in answers]
    _, body = get(f"http://127.0.0.1:{port}/health")
    peak = json.loads(body).get("peak_queued", poll.peak_queued)
    counts = {c: codes.count(c) for c in sorted(set(codes))}
    return f"burst of {n} (max_queued 256): peak queue {peak} (polled {poll.peak_queued}); answers {counts}"


def probe_restart(port: int, pid: int) -> str:
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        try:
            if get(f"http://127.0.0.1:{port}/health", timeout=2)[0] in (200, 503):
                return f"gateway SIGKILL: answering again after {time.monotonic() - t0:.2f} s"
        except OSError:
            pass
        time.sleep(0.05)
    return "gateway SIGKILL: not answering 60 s later (nothing restarted it)"


def free_blocks(metrics_url: str) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("nv_trt_llm_kv_cache_block_metrics{") and 'kv_cache_block_type="free"' in line)


def probe_gone(port: int, key: str | None, prefill_metrics: str, total: float) -> str:
    body = json.dumps({"model": "tiny-llama", "prompt": "The cache " * 300, "max_tokens": 64,
                       "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + (f"Authorization: Bearer {key}\r\n" if key else "") + f"Content-Length: {len(body)}\r\n\r\n").encode()
    for i in range(100):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(head + body)
        time.sleep(0.005 * (i % 7))
        s.close()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 45:
        if free_blocks(prefill_metrics) == total:
            return f"100 clients gone before their first token: every prefill KV block free {time.monotonic() - t0:.1f} s later"
        time.sleep(0.1)
    return f"100 clients gone before their first token: {total - free_blocks(prefill_metrics):.0f} blocks still held 45 s later"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=Path, required=True, help="a built reference-fp16 folder")
    p.add_argument("--path", default=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   help="PATH to find the trtpd under test (default: this interpreter's bin first)")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    home = Path(tempfile.mkdtemp(prefix="trtpd-attack-"))
    env = {**os.environ, "TRTPD_HOME": str(home), "PATH": args.path, "COLUMNS": "250"}
    up = trtpd("up", "--fleet", "--prefill", "1", "--decode", "1", "--name", "probe", "--engines", str(args.engines),
               env=env, limit=FD_LIMIT)
    if up.returncode:
        print(up.stdout, up.stderr)
        return 1
    try:
        port = int(re.search(r"OpenAI API\s+http://127\.0\.0\.1:(\d+)/v1", up.stdout).group(1))
        key = (m.group(1) if (m := re.search(r"API key\s+(sk-trtpd-\S+)", up.stdout)) else None)
        view = next(r for r in json.loads(trtpd("status", "--name", "probe", "--json", env=env).stdout)
                    if r.get("kind") == "fleet")
        pid = int(view["gateway"]["pid"])
        log = Path(view["gateway"].get("log") or home / "deployments/probe/gateway/gateway.log")
        prefill = next(i for i in view["instances"] if i["role"] == "prefill")
        total = free_blocks(prefill["metrics"])
        print(probe_word(port, key), flush=True)
        print(probe_body(port, key, pid), flush=True)
        print(probe_burst(port, key), flush=True)
        print(probe_gone(port, key, prefill["metrics"], total), flush=True)
        print(probe_idle(port, key, pid, log, 7000), flush=True)
        print(probe_restart(port, pid), flush=True)
    finally:
        trtpd("down", "--name", "probe", env=env)
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
