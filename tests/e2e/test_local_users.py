"""Local users get nothing: another uid on the same host, running the attacks of the hardening issue
against real deployments, is refused each time, and the deployment's own requests still complete.

The attacker is uid/gid 65534 (nobody) under setpriv, running Debian's /usr/bin/python3 with only the
standard library (it cannot read the project's venv, which lives under root's folders anyway)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from trtpd.bench.prompts import prompt_with_tokens
from trtpd.kv.frame import ErrorCode
from trtpd.fleet.server_guard import ADMIN_HEADER, ADMIN_KEY_FILE

pytestmark = pytest.mark.e2e
ATTACKER_UID = 65534
ATTACKER = r'''
import json, os, socket, struct, sys, urllib.error, urllib.request

def open_file(path):
    try:
        with open(path, "rb") as f:
            f.read(16)
        return "read"
    except PermissionError:
        return "PermissionError"
    except OSError as e:
        return type(e).__name__

def http(method, url, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json",
                                                                        **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")

HEADER = struct.Struct("!4sBBHQ")

def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf

def recv_frame(sock):
    magic, kind, code, layer, size = HEADER.unpack(recv_exact(sock, HEADER.size))
    return {"magic": magic.decode(errors="replace"), "kind": kind, "code": code,
            "payload": recv_exact(sock, min(size, 1 << 20)).decode(errors="replace")}

def steal(handle_hex, proof):
    handle = bytes.fromhex(handle_hex)
    endpoint = json.loads(handle[36:])["endpoint"]          # the handle is readable: MAGIC | HMAC | JSON
    host, port = endpoint.split("://")[1].split("/")[0].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=20)
    hello = recv_frame(sock)
    payload = (bytes(64) + handle) if proof else handle     # a made-up proof, or the handle alone
    sock.sendall(HEADER.pack(hello["magic"].encode(), 1, 0, 0, len(payload)) + payload)
    answer = recv_frame(sock)
    sock.close()
    return {"hello_kind": hello["kind"], "answer": answer}

def main():
    task = json.loads(sys.argv[1])
    out = {"uid": os.getuid()}
    if task["kind"] == "files":
        out["opened"] = {p: open_file(p) for p in task["paths"]}
        out["cmdlines"] = {}
        for pid in task["pids"]:
            try:
                out["cmdlines"][pid] = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            except OSError as e:
                out["cmdlines"][pid] = type(e).__name__
        out["environ"] = {pid: open_file(f"/proc/{pid}/environ") for pid in task["pids"]}
    elif task["kind"] == "http":
        out["answers"] = [http(*call) for call in task["calls"]]
    elif task["kind"] == "steal":
        out["pulls"] = [steal(task["handle"], proof) for proof in (False, True)]
    print(json.dumps(out))

main()
'''


def as_attacker(task: dict) -> dict:
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run the attacker as another uid: apt-get install util-linux"
    result = subprocess.run([setpriv, f"--reuid={ATTACKER_UID}", f"--regid={ATTACKER_UID}", "--clear-groups",
                             "/usr/bin/python3", "-I", "-c", ATTACKER, json.dumps(task)],
                            capture_output=True, text=True, timeout=120, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["uid"] == ATTACKER_UID
    return out


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def state_files(server) -> dict[Path, int]:
    folder = Path(server.server.log_path).parent
    repo = Path(server.server.repo)
    files = [folder, folder / "fleet.json", Path(server.server.log_path), folder / ADMIN_KEY_FILE,
             repo.parent / f"{repo.name}.kv.key"]
    return {p: p.stat().st_mode & 0o777 for p in files}


def prompt_ids(tokenizer, n: int, seed: int) -> list[int]:
    return tokenizer.encode(prompt_with_tokens(tokenizer, n, seed=seed))


def role_inputs(ids: list[int], max_tokens: int = 4, handle: bytes | None = None) -> dict:
    tensors = {"input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
               "request_output_len": np.array([[max_tokens]], dtype=np.int32)}
    if handle is not None:
        tensors["context_phase_params"] = np.frombuffer(handle, dtype=np.uint8).reshape(1, -1)
    return tensors


def test_shm_regions_kv_pool_and_state_files_are_private(fp16_disagg):
    shm = sorted(Path("/dev/shm").glob(f"{fp16_disagg.server.shm_prefix}*"))
    pools = [p for p in shm if "kv_" in p.name]
    assert pools and len(shm) > len(pools), f"expected python-backend regions and a KV pool, found {shm}"
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in shm} == {p.name: "0o600" for p in shm}
    modes = state_files(fp16_disagg)
    folder = Path(fp16_disagg.server.log_path).parent
    assert modes.pop(folder) == 0o700
    assert set(modes.values()) == {0o600}, {str(p): oct(m) for p, m in modes.items()}

    pids = [fp16_disagg.server.pid, *children(fp16_disagg.server.pid)]
    assert len(pids) >= 5          # tritonserver and its python stubs
    out = as_attacker({"kind": "files", "paths": [str(p) for p in shm] + [str(p) for p in modes], "pids": pids})
    assert set(out["opened"].values()) == {"PermissionError"}, out["opened"]
    secret = Path(folder / ADMIN_KEY_FILE).read_text().strip()
    assert all(secret not in cmdline for cmdline in out["cmdlines"].values())
    assert "restricted" not in out["cmdlines"][str(fp16_disagg.server.pid)]
    assert set(out["environ"].values()) == {"PermissionError"}


def _admin_calls(url: str, pool: str) -> list[list]:
    return [["POST", f"{url}/v2/systemsharedmemory/region/kvpool/register",
             {"key": f"/{pool}", "offset": 0, "byte_size": 4096}],
            ["GET", f"{url}/v2/systemsharedmemory/status"],
            ["POST", f"{url}/v2/repository/index", {}],
            ["POST", f"{url}/v2/repository/models/prefill/unload", {}],
            ["GET", f"{url}/v2/logging"],
            ["POST", f"{url}/v2/logging", {"log_file": "/tmp/trtpd-attacker.log"}],
            ["GET", f"{url}/v2/trace/setting"],
            ["POST", f"{url}/v2/trace/setting", {"trace_file": "/tmp/trtpd-attacker.trace"}]]


def test_admin_apis_need_the_deployment_header(fp16_disagg):
    url = f"http://{fp16_disagg.server.http_url}"
    pool = next(p.name for p in Path("/dev/shm").glob(f"{fp16_disagg.server.shm_prefix}kv_*"))
    out = as_attacker({"kind": "http", "calls": [["GET", f"{url}/v2/health/ready"]] + _admin_calls(url, pool)})
    (ready, _), *refused = out["answers"]
    assert ready == 200                                     # inference-side APIs stay open
    assert all(400 <= status < 500 for status, _ in refused), refused
    assert all("restricted" in body.lower() or "header" in body.lower() for _, body in refused), refused
    assert not Path("/tmp/trtpd-attacker.log").exists() and not Path("/tmp/trtpd-attacker.trace").exists()
    # the same calls with the header (read-only ones) succeed: the refusals were the restriction, not bad URLs
    headers = fp16_disagg.server.admin_headers()
    for method, path in (("GET", "/v2/systemsharedmemory/status"), ("POST", "/v2/repository/index"),
                         ("GET", "/v2/logging"), ("GET", "/v2/trace/setting")):
        req = urllib.request.Request(url + path, data=b"{}" if method == "POST" else None, method=method,
                                     headers=headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200, path
    # gRPC: the same restriction (the header travels as metadata)
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    client = grpcclient.InferenceServerClient(fp16_disagg.grpc_url)
    try:
        with pytest.raises(InferenceServerException):
            client.get_system_shared_memory_status()
        with pytest.raises(InferenceServerException):
            client.get_model_repository_index()
        grpc_headers = fp16_disagg.server.admin_headers("grpc")
        client.get_system_shared_memory_status(headers=grpc_headers)
        index = client.get_model_repository_index(headers=grpc_headers)
        assert {m.name for m in index.models} >= {"prefill", "decode"}
    finally:
        client.close()
    assert ADMIN_HEADER in headers


def test_a_captured_handle_without_the_key_gets_no_kv_and_the_victim_completes(fp8_disagg, tokenizer):
    start = fp8_disagg.idle_blocks("prefill")
    ids = prompt_ids(tokenizer, 200, seed=11)
    responses = fp8_disagg.call("prefill", role_inputs(ids), parameters={"request_type": "context_only"})
    handle = responses[-1].as_numpy("context_phase_params").reshape(-1).tobytes()
    assert b'"endpoint":"tcp://127.0.0.1:' in handle
    # 200 tokens = 7 blocks held for their owner; waited for, as the metrics lag the engine by up to 0.15 s
    # (a fast machine ran the whole attack inside that lag, and an immediate read still saw every block free)
    fp8_disagg.wait_blocks("prefill", start - 7, timeout_s=10)
    out = as_attacker({"kind": "steal", "handle": handle.hex()})
    for pull in out["pulls"]:       # the handle alone (as before), and the handle with a made-up proof
        assert pull["answer"]["kind"] == 7 and pull["answer"]["code"] == ErrorCode.UNAUTHENTICATED, pull
        assert "refused the pull" in pull["answer"]["payload"] and "KV key" in pull["answer"]["payload"]
    # the export survived the refused pulls: its owner still pulls it (a released export answers the decode
    # side with an error, and no token comes back)
    decoded = fp8_disagg.call("decode", role_inputs(ids, handle=handle), parameters={"request_type": "generation_only"})
    tokens = [int(t) for r in decoded if r.as_numpy("output_ids") is not None
              for t in r.as_numpy("output_ids").reshape(-1)]
    assert len(tokens) == 4
    fp8_disagg.wait_blocks("prefill", start)


def test_role_models_refuse_requests_that_do_not_come_from_the_orchestrator(fp16_disagg, tokenizer):
    start = fp16_disagg.idle_blocks("prefill")
    url = f"http://{fp16_disagg.server.http_url}"
    ids = prompt_ids(tokenizer, 900, seed=21)
    body = {"input_ids": ids, "input_lengths": [len(ids)], "request_output_len": [8],
            "parameters": {"request_type": "context_only"}}
    forged = {**body, "parameters": {"request_type": "context_only", "trtpd_auth": "v1:1.0:" + "0" * 64}}
    out = as_attacker({"kind": "http", "calls": [["POST", f"{url}/v2/models/prefill/generate_stream", body]] * 6
                       + [["POST", f"{url}/v2/models/prefill/generate_stream", forged]]})
    for status, text in out["answers"]:
        assert "permission denied" in text and "trtpd_auth" in text, (status, text)
    assert fp16_disagg.kv_blocks("prefill") == start          # no block was pinned, not even for a moment

    # over gRPC without the proof (any client, any uid): prefill and decode refuse with a clear error
    with pytest.raises(RuntimeError, match=r"permission denied: model 'prefill' serves only the deployment's "
                                           r"orchestrator.*carries no trtpd_auth"):
        fp16_disagg.call("prefill", role_inputs(ids), parameters={"request_type": "context_only"}, auth=False)
    responses = fp16_disagg.call("prefill", role_inputs(ids), parameters={"request_type": "context_only"})
    handle = responses[-1].as_numpy("context_phase_params").reshape(-1).tobytes()
    with pytest.raises(RuntimeError, match=r"permission denied: model 'decode'.*carries no trtpd_auth"):
        fp16_disagg.call("decode", role_inputs(ids, handle=handle), parameters={"request_type": "generation_only"},
                         auth=False)
    # a proof made for prefill does not open decode (another request type)
    wrong = fp16_disagg.orchestrator_auth("context_only", [ids])
    with pytest.raises(RuntimeError, match=r"permission denied: model 'decode'.*does not verify"):
        fp16_disagg.call("decode", role_inputs(ids, handle=handle),
                         parameters={"request_type": "generation_only", **wrong}, auth=False)
    assert len(fp16_disagg.call("decode", role_inputs(ids, handle=handle),
                                parameters={"request_type": "generation_only"})) >= 1
    fp16_disagg.wait_blocks("prefill", start)
    # and the orchestrator's own path is untouched
    result = fp16_disagg.stream({"ok": "A request through the ensemble after the refusals."}, 4)["ok"]
    assert result.error is None and len(result.token_ids) == 4


def test_colocated_refuses_direct_requests_too(fp16_coloc, tokenizer):
    ids = prompt_ids(tokenizer, 50, seed=31)
    with pytest.raises(RuntimeError, match=r"permission denied: model 'colocated'.*carries no trtpd_auth"):
        fp16_coloc.call("colocated", role_inputs(ids), auth=False)
    assert len(fp16_coloc.call("colocated", role_inputs(ids))) >= 1
    assert os.path.exists(fp16_coloc.server.admin_key_file)


def test_another_user_cannot_read_the_gateway_key_and_gets_401(trtpd_home, fp16_root):
    """The OpenAI API needs a key by default; the key file is the owner's only (0600 in a 0700 folder), so another
    local user gets 401 on the API, /metrics and the API documents; /health (probes) answers."""
    from trtpd.deploy.spec import ReferenceDeployment

    from .conftest import fleet_with_gateway
    with fleet_with_gateway("users-gw", ReferenceDeployment(fp16_root), prefill=1, decode=1) as fleet:
        base = f"http://127.0.0.1:{fleet.gateway['port']}"
        body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2}
        out = as_attacker({"kind": "files", "paths": [fleet.gateway["api_key_file"]], "pids": []})
        assert out["opened"][fleet.gateway["api_key_file"]] == "PermissionError"
        out = as_attacker({"kind": "http", "calls": [
            ["POST", f"{base}/v1/completions", body], ["GET", f"{base}/v1/models"], ["GET", f"{base}/metrics"],
            ["GET", f"{base}/docs"], ["GET", f"{base}/openapi.json"],
            ["POST", f"{base}/v1/completions", body, {"Authorization": "Bearer sk-guessed"}],
            ["GET", f"{base}/health"]]})
        *refused, (health, _) = out["answers"]
        assert [status for status, _ in refused] == [401] * 6 and health == 200
        assert all("API key" in text for _, text in refused[:2])
