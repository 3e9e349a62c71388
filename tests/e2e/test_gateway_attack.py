"""The gateway under attack, against a real 1P+1D fleet (loopback only, bounded in count and time): no single
request or pile of sockets stalls it, every client fault is a counted 4xx on a connection that stays usable,
bodies are bounded however they arrive, admission bounds are exact, KV follows the client, nothing stays dead,
and the API needs a key. Each test fails on the code before the hardening issue (the closing note has the
figures)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import httpx
import openai
import pytest

from trtpd.bench.prompts import prompt_with_tokens
from trtpd.deploy.spec import ReferenceDeployment

from .conftest import auth, extra_gateway, fleet_with_gateway, gateway_key, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fleet(trtpd_home, fp16_root):
    with fleet_with_gateway("gw-attack", ReferenceDeployment(fp16_root), prefill=1, decode=1) as fleet:
        yield fleet


def client_for(port: int, key: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, **kw)


def post(port: int, key: str, body, path: str = "/v1/completions", timeout: float = 60.0) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


class HealthPoller:
    """Polls /health every 20 ms on its own connection; records each answer's latency."""

    def __init__(self, port: int) -> None:
        self.port, self.latencies_s, self._stop = port, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        while not self._stop.is_set():
            started = time.monotonic()
            conn.request("GET", "/health")
            conn.getresponse().read()
            self.latencies_s.append(time.monotonic() - started)
            time.sleep(0.02)

    def wait_samples(self, more: int, timeout_s: float = 30.0) -> None:
        """Until `more` further answers came (the poll runs before, during and after what is measured)."""
        target = len(self.latencies_s) + more
        wait_for(lambda: len(self.latencies_s) >= target, timeout_s, f"{more} /health answers")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=130)


def metric(port: int, key: str, pattern: str) -> float:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {key}"})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer("^" + pattern + r" (\S+)$", text, re.M))


def vm_kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1))


# ---- one request cannot stall the loop -------------------------------------------------------------
def test_a_megabyte_word_and_the_longest_accepted_prompt_never_stall_the_loop(fleet, tokenizer):
    port, key = fleet.gateway["port"], gateway_key(fleet)
    max_input_len = min(i.max_input_len for i in fleet.instances)
    longest = max_input_len * tokenizer.max_token_chars          # the longest prompt that gets tokenized
    with HealthPoller(port) as poller:
        poller.wait_samples(3)
        answers = []
        for prompt in ("x" * 1_000_000, "y" * 16_019, "z" * longest, "q" * (longest + 1)):
            started = time.monotonic()
            status, body = post(port, key, {"model": "tiny-llama", "prompt": prompt, "max_tokens": 1})
            answers.append((len(prompt), status, body["error"]["code"], time.monotonic() - started))
        poller.wait_samples(3)
    print(f"answers (chars, status, code, s): {answers}; /health polls {len(poller.latencies_s)}, "
          f"slowest {max(poller.latencies_s) * 1000:.1f} ms")
    assert [(s, c) for _, s, c, _ in answers] == [(400, "context_length_exceeded")] * 4
    assert max(poller.latencies_s) < 1.0      # the hand-written tokenizer held the loop 17 s for 16,019 chars
    assert len(poller.latencies_s) >= 10


# ---- connections are bounded -----------------------------------------------------------------------
def test_idle_and_half_sent_connections_beyond_the_limit_do_not_lock_clients_out(fleet, tmp_path):
    """An open-file limit of 1,024, as in the issue's probe: 1,100 idle connections and 20 that send half a
    header. The gateway keeps its connection bound, closes the longest-idle ones for new clients, answers the
    half-sent ones 408 after the read timeout, never runs out of descriptors, and its log stays small."""
    key = gateway_key(fleet)
    with extra_gateway(fleet, tmp_path / "gw", "--max-connections", "500", "--request-read-timeout-s", "2",
                       "--keep-alive-timeout-s", "30", max_open_files=1024) as (port, pid):
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(1100)]
        half = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            half.append(s)
        try:
            c = client_for(port, key, timeout=30)
            served = [c.completions.create(model="tiny-llama", prompt=f"hello {i}", max_tokens=2).usage
                      for i in range(5)]
            health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read())
            answers = []
            for s in half:     # each is answered once the 2 s read timeout ran out (the sweep runs every second)
                s.settimeout(15)
                answers.append(s.recv(200))
            closed = 0
            for s in idle:
                s.setblocking(False)
                try:
                    closed += s.recv(1) == b""
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    closed += 1
            log = (tmp_path / "gw" / "gateway.log").read_text()
        finally:
            for s in idle + half:
                s.close()
        open_fds = len(os.listdir(f"/proc/{pid}/fd"))
    print(f"served {len(served)} while 1,120 connections were held; {closed} idle ones closed by the gateway; "
          f"{open_fds} descriptors open; log {len(log)} bytes")
    assert len(served) == 5 and health["status"] == "ok"
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[:3]
    assert closed >= 1100 - 500 + 5           # evicted to stay within the bound (the rest: still idle)
    assert open_fds < 1000 and "Too many open files" not in log and len(log) < 100_000


# ---- bodies are bounded ----------------------------------------------------------------------------
def test_a_chunked_40_mib_body_gets_413_and_memory_stays_bounded(fleet, tmp_path):
    key = gateway_key(fleet)
    with extra_gateway(fleet, tmp_path / "gw") as (port, pid):
        before_kib = vm_kib(pid, "VmRSS")
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + key.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n" % (1 << 20) + b"a" * (1 << 20) + b"\r\n"
        sent = 0
        try:
            for _ in range(40):
                sock.sendall(chunk)
                sent += 1
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass    # the gateway answered and closed before the whole body was sent
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                data = sock.recv(4096)
                if not data:
                    break
                answer += data
        except ConnectionResetError:
            pass
        sock.close()
        peak_kib = vm_kib(pid, "VmHWM")
        after_kib = vm_kib(pid, "VmRSS")
        status, _ = post(port, key, {"model": "tiny-llama", "prompt": "still serving", "max_tokens": 1})
    print(f"chunked 40 MiB: {answer[:40]!r} after {sent} MiB sent; RSS {before_kib / 1024:.0f} MB before, peak "
          f"{peak_kib / 1024:.0f} MB, {after_kib / 1024:.0f} MB after")
    assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer.lower()
    assert peak_kib - before_kib < 32 * 1024        # the limit is 1 MiB; before, the whole 40 MiB was read
    assert status == 200


# ---- every client fault is a counted 4xx -----------------------------------------------------------
FAULTS = [
    (b'{"model": "tiny-llama", "prompt": "a\\ud800b"}', "/v1/completions", "prompt"),
    (b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "a\\udfffb"}]}', "/v1/chat/completions",
     "messages.0.content"),
    (b'{"model": "tiny-llama", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "/v1/completions", None),
    (b'{"model": "tiny-llama", "prompt": "x", "seed": ' + b"7" * 5000 + b"}", "/v1/completions", None),
    (b'{"model": "tiny-llama", "prompt": "x", "top_p": 1e-50}', "/v1/completions", "top_p"),
    (b'{"model": "tiny-llama", "prompt": "x", "top_p": 1e-50, "stream": true}', "/v1/completions", "top_p"),
    (b'{"model": "tiny-llama", "prompt": "x", "best_of": 0}', "/v1/completions", "best_of"),
]


def test_client_faults_are_400s_naming_the_field_counted_on_a_connection_that_stays_open(fleet):
    port, key = fleet.gateway["port"], gateway_key(fleet)
    pattern = r'trtpd_gateway_requests_total\{endpoint="[^"]+",status="400"\}'
    before = metric(port, key, pattern)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    for body, path, param in FAULTS:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        error = json.loads(response.read())["error"]
        assert response.status == 400 and error["param"] == param, (body[:80], response.status, error)
        assert response.getheader("connection") != "close"
    conn.request("POST", "/v1/completions", body=b'{"model": "tiny-llama", "prompt": "ok", "max_tokens": 2}',
                 headers=headers)    # the same keep-alive connection serves the next request
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read())["usage"]["completion_tokens"] >= 1
    assert metric(port, key, pattern) - before == len(FAULTS)


# ---- admission that holds ------------------------------------------------------------------------
def listen_overflows() -> int:
    """The kernel's count of connections dropped because a listen queue was full (TcpExt ListenOverflows)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split()))["ListenOverflows"])
    raise AssertionError("no TcpExt line in /proc/net/netstat")


def test_a_1000_request_burst_never_exceeds_the_inflight_and_queue_bounds(fleet, tmp_path):
    """Also: the gateway's listen queue holds the burst. With asyncio's backlog of 128 as the kernel's queue, ~490
    of the 1,000 connects overflowed it a run; SYN cookies stood in, and one that failed to validate reset its
    connection, a client's httpx.ReadError (seen in 2 of 8 runs, connections.LISTEN_BACKLOG)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    burst = min(1000, (hard - 400) // 2)            # one connection per request, here and in the gateway
    key = gateway_key(fleet)
    try:
        with extra_gateway(fleet, tmp_path / "gw", "--max-inflight", "4", "--max-queued", "16",
                           "--max-connections", str(burst + 50)) as (port, _):
            async def burst_of(n: int):
                limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=120,
                                             headers={"Authorization": f"Bearer {key}"}) as c:
                    body = {"model": "tiny-llama", "prompt": "The burst", "max_tokens": 8, "ignore_eos": True}
                    return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(n)))
            overflows = listen_overflows()
            answers = asyncio.run(burst_of(burst))
            overflows = listen_overflows() - overflows
            health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    codes = [a.status_code for a in answers]
    print(f"burst of {burst}: {codes.count(200)} served, {codes.count(429)} refused (429); peak in flight "
          f"{health['peak_inflight']}, peak queued {health['peak_queued']}")
    assert set(codes) <= {200, 429} and codes.count(429) > 0 and codes.count(200) >= 20
    assert health["peak_inflight"] <= 4 and health["peak_queued"] <= 16     # was 936 queued against 256
    assert all(a.headers["retry-after"] == "1" for a in answers if a.status_code == 429)
    assert all(a.json()["usage"]["completion_tokens"] == 8 for a in answers if a.status_code == 200)
    assert health["inflight"] == 0 and health["queued"] == 0
    assert overflows == 0, f"{overflows} connections overflowed a listen queue during the burst"


# ---- KV and memory follow the client -------------------------------------------------------------
def _free_blocks(inst) -> float:
    text = urllib.request.urlopen(inst.metrics_url, timeout=5).read().decode()
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("nv_trt_llm_kv_cache_block_metrics{") and 'kv_cache_block_type="free"' in line)


def test_clients_gone_before_their_first_token_free_the_prefill_kv_at_once(fleet, tokenizer):
    """100 streaming clients hang up right after sending: every prefill export is freed long before the 30 s
    export deadline (the give-up reaches the exporter even when the handle arrived as the client left)."""
    port, key = fleet.gateway["port"], gateway_key(fleet)
    baseline = {i.name: float(i.num_kv_blocks) for i in fleet.instances}
    wait_for(lambda: {i.name: _free_blocks(i) for i in fleet.instances} == baseline, 30, "the fleet was not idle")
    prompt = prompt_with_tokens(tokenizer, 600, seed=7)
    body = json.dumps({"model": "tiny-llama", "prompt": prompt, "max_tokens": 64, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
            f"{key}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    for i in range(100):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(head + body)
        time.sleep(0.005 * (i % 7))   # some leave while queued, some during prefill, some as the handle arrives
        s.close()
    left = time.monotonic()
    wait_for(lambda: {i.name: _free_blocks(i) for i in fleet.instances} == baseline, 15,
             "KV blocks did not return to baseline well before the 30 s export deadline")
    print(f"100 clients gone before their first token: every KV block free {time.monotonic() - left:.1f} s later")


def test_a_client_that_stops_reading_is_cancelled_after_a_bounded_buffer(fleet, tmp_path):
    key = gateway_key(fleet)
    with extra_gateway(fleet, tmp_path / "gw", "--stream-buffer-bytes", "4096", "--max-buffered-chunks", "16",
                       "--send-timeout-s", "3") as (port, _):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # a client that reads nothing, small buffer
        sock.connect(("127.0.0.1", port))
        body = json.dumps({"model": "tiny-llama", "prompt": "Generate", "max_tokens": 1500, "ignore_eos": True,
                           "stream": True}).encode()
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
        wait_for(lambda: metric(port, key, "trtpd_gateway_slow_clients_total") == 1, 60,
                 "the stream of a client that reads nothing was not cancelled")
        from trtpd.kv.auth import gateway_admin_token
        from trtpd.kv.handle import load_or_create_key_file
        token = gateway_admin_token(load_or_create_key_file(fleet.key_file))
        req = urllib.request.Request(f"http://127.0.0.1:{port}/admin/requests",
                                     headers={"Authorization": f"Bearer {token}"})
        wait_for(lambda: json.loads(urllib.request.urlopen(req, timeout=10).read())["requests"], 10, "no sample")
        (sample,) = json.loads(urllib.request.urlopen(req, timeout=10).read())["requests"]
        # the gateway closes the connection once nothing could be sent for the send timeout
        sock.settimeout(15)
        received = 0
        try:
            while chunk := sock.recv(65536):
                received += len(chunk)
        except (ConnectionResetError, socket.timeout):
            pass
        sock.close()
    print(f"slow client: generation stopped after {sample['num_tokens']} of 1,500 tokens; {received} bytes were "
          f"in flight")
    assert sample["num_tokens"] < 1500 and not sample["ok"]


# ---- auth by default ---------------------------------------------------------------------------------
def test_the_api_needs_a_key_and_key_files_others_can_read_are_refused(fleet, tmp_path):
    port = fleet.gateway["port"]
    for path in ("/v1/models", "/metrics", "/docs", "/openapi.json"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
        assert err.value.code == 401, path
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).status == 200   # probes
    assert Path(fleet.gateway["api_key_file"]).stat().st_mode & 0o777 == 0o600
    import subprocess
    import sys
    loose = tmp_path / "keys"
    loose.write_text("sk-readable-by-everyone\n")
    loose.chmod(0o644)
    refused = subprocess.run([sys.executable, "-m", "trtpd.gateway", "--fleet-file", str(fleet.path),
                              "--api-key-file", str(loose)], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "readable by others" in refused.stderr and "chmod 600" in refused.stderr
    nokey = subprocess.run([sys.executable, "-m", "trtpd.gateway", "--fleet-file", str(fleet.path)],
                           capture_output=True, text=True, timeout=60)
    assert nokey.returncode == 2 and "needs an API key" in nokey.stderr
    public = subprocess.run([sys.executable, "-m", "trtpd.gateway", "--fleet-file", str(fleet.path), "--no-auth",
                             "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60)
    assert public.returncode == 2 and "loopback" in public.stderr


# ---- nothing stays dead ------------------------------------------------------------------------------
def test_a_killed_gateway_is_back_on_its_port_within_seconds_and_a_dead_instance_fails_fast(fleet):
    port, key = fleet.gateway["port"], gateway_key(fleet)
    from trtpd.fleet.gateway_process import running_gateway
    first = running_gateway(fleet.gateway)
    os.kill(first["pid"], signal.SIGKILL)
    killed = time.monotonic()

    def back():
        try:
            return client_for(port, key, timeout=10).completions.create(model="tiny-llama", prompt="back?",
                                                                         max_tokens=2).usage.completion_tokens
        except openai.APIConnectionError:
            return None
    wait_for(back, 20, "the gateway was not restarted")
    restarted_s = time.monotonic() - killed
    again = running_gateway(fleet.gateway)
    assert again["pid"] != first["pid"] and again["port"] == port
    # a plain fleet has no controller to heal it: a dead instance is reported, and requests fail fast (503)
    decode = next(i for i in fleet.instances if i.role == "decode")
    os.kill(decode.server.pid, signal.SIGKILL)

    def reported():
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
            return exc.code == 503 and body["status"] == "unavailable"
        return False
    wait_for(reported, 20, "/health did not report the dead decode instance")
    started = time.monotonic()
    status, body = post(port, key, {"model": "tiny-llama", "prompt": "anyone?", "max_tokens": 2, "stream": True})
    failed_s = time.monotonic() - started
    print(f"gateway SIGKILL -> serving again in {restarted_s:.1f} s (pid {first['pid']} -> {again['pid']}); dead "
          f"decode -> streaming request answered {status} in {failed_s:.2f} s")
    assert status == 503 and "decode" in body["error"]["message"] and failed_s < 5.0   # was a 15 s wait, then 200
