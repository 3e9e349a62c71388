"""trtllm-serve's path on CPU: twin workers (real processes, real HTTP, KV over trtpd's TCP transport) behind the
gateway's trtllm-serve transport, driven by the official openai client; and each worker's protocol as
trtllm-serve 1.2.1 speaks it (docs/serve-twin.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from trtpd.catalog import get_model
from trtpd.engine import corpus
from trtpd.engine.checkpoint import load_checkpoint
from trtpd.kv.auth import orchestrator_token
from trtpd.kv.handle import load_or_create_key_file

from .conftest import fuzz_openapi

pytestmark = pytest.mark.e2e
START_TIMEOUT_S = 90.0
CTX_YAML = ("cache_transceiver_config:\n  backend: UCX\n  kv_transfer_timeout_ms: 30000\n"
            "kv_cache_config:\n  dtype: fp16\n  free_gpu_memory_fraction: 0.2\n"
            "disable_overlap_scheduler: true\nenable_iter_perf_stats: true\n"
            "return_perf_metrics: true\nperf_metrics_max_requests: 100\n")


class Proc:
    """A child process with the address it wrote to its state file; stopped by its pid."""

    def __init__(self, argv: list[str], state: Path, log: Path) -> None:
        self.state, self.log = state, log
        self.popen = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        try:
            self._wait(argv, state, log)
        except BaseException:       # whatever went wrong, the process this started does not outlive the test
            self.stop()
            raise

    def _wait(self, argv: list[str], state: Path, log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not state.exists():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{argv[2]} did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        self.port = json.loads(state.read_text())["port"]
        self.url = f"http://127.0.0.1:{self.port}"
        while not self._healthy():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{argv[2]} is not healthy: {log.read_text()[-2000:]}")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:    # bound before it listens: refused until then
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        except httpx.ConnectError:
            return False

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def twin(tmp: Path, name: str, model: Path, *flags: str) -> Proc:
    return Proc([sys.executable, "-m", "trtpd.serve_twin", str(model), "--port", "0", "--twin_state_file",
                 str(tmp / f"{name}.json"), *flags], tmp / f"{name}.json", tmp / f"{name}.log")


@pytest.fixture(scope="module")
def serve_fleet(fp16_root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-twin")
    key = tmp / "deployment.key"
    load_or_create_key_file(key)
    (tmp / "ctx.yaml").write_text(CTX_YAML)
    procs: list[Proc] = []
    try:
        role = ["--twin_key_file", str(key), "--extra_llm_api_options", str(tmp / "ctx.yaml")]
        procs.append(twin(tmp, "gen", fp16_root, "--server_role", "GENERATION", *role))
        procs.append(twin(tmp, "ctx", fp16_root, "--server_role", "CONTEXT", *role))
        procs.append(twin(tmp, "colo", fp16_root))        # both phases, no key, no iteration stats
        gen, ctx, colo = procs

        def inst(name, role, proc):
            return {"name": name, "role": role, "model": "tiny-llama", "grpc_url": "", "metrics_url": "",
                    "max_input_len": 2048, "max_seq_len": 2560, "http_url": f"127.0.0.1:{proc.port}",
                    "protocol": "trtllm-serve"}
        fleet = {"name": "serve-twin", "mode": "disaggregated", "key_file": str(key),
                 "tokenizer_dir": str(fp16_root / "checkpoint"),
                 "instances": [inst("prefill-0", "prefill", ctx), inst("decode-0", "decode", gen)]}
        (tmp / "fleet.json").write_text(json.dumps(fleet))
        procs.append(Proc([sys.executable, "-m", "trtpd.gateway", "--fleet-file", str(tmp / "fleet.json"),
                           "--no-auth", "--port", "0", "--state-file", str(tmp / "gateway.json")],
                          tmp / "gateway.json", tmp / "gateway.log"))
        yield {"gen": gen, "ctx": ctx, "colo": colo, "gateway": procs[-1], "key": load_or_create_key_file(key),
               "root": fp16_root}
    finally:
        for proc in reversed(procs):
            proc.stop()


def _prompts(root: Path, lengths: list[int]) -> list[str]:
    tokenizer = load_checkpoint(root / "checkpoint").load_tokenizer()
    ids = tokenizer.encode(corpus.text(400, seed=7), add_bos=False)
    return [tokenizer.decode(ids[i * 37:i * 37 + n]) for i, n in enumerate(lengths)]


def _colocated(fleet, prompt: str, max_tokens: int) -> dict:
    r = httpx.post(f"{fleet['colo'].url}/v1/completions", timeout=120,
                   json={"model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_openai_client_through_the_gateway_gets_the_colocated_engines_text(serve_fleet):
    """20 prompts of 1-1,500 tokens, greedy: prefill on the context twin, KV over TCP to the generation twin, the
    gateway's trtllm-serve transport in between, equal to the colocated engine's text; usage right."""
    client = openai.OpenAI(base_url=f"{serve_fleet['gateway'].url}/v1", api_key="unused", max_retries=0)
    lengths = [1, 3, 8, 15, 30, 50, 80, 120, 180, 250, 330, 420, 520, 640, 760, 900, 1050, 1200, 1350, 1500]
    for prompt in _prompts(serve_fleet["root"], lengths):
        got = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=6, temperature=0)
        want = _colocated(serve_fleet, prompt, 6)
        assert got.choices[0].text == want["choices"][0]["text"]
        assert got.choices[0].finish_reason == want["choices"][0]["finish_reason"]
        assert (got.usage.prompt_tokens, got.usage.completion_tokens) == \
            (want["usage"]["prompt_tokens"], want["usage"]["completion_tokens"])


def test_streamed_text_equals_the_whole_text(serve_fleet):
    client = openai.OpenAI(base_url=f"{serve_fleet['gateway'].url}/v1", api_key="unused", max_retries=0)
    for prompt in _prompts(serve_fleet["root"], [12, 200]):
        whole = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=10, temperature=0)
        chunks = list(client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=10, temperature=0,
                                                stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_a_clients_disaggregated_params_never_reach_a_worker(serve_fleet):
    """A client that sends context_only/generation_only fields itself could pin a context worker's KV (a known
    denial of service in peers): the gateway refuses the field by name."""
    r = httpx.post(f"{serve_fleet['gateway'].url}/v1/completions", timeout=30, json={
        "model": "tiny-llama", "prompt": "hi", "max_tokens": 2,
        "disaggregated_params": {"request_type": "context_only"}})
    assert r.status_code == 400 and "disaggregated_params" in r.json()["error"]["message"]


def _auth(fleet, request_type: str, ids: list[int]) -> dict:
    return {"x-trtpd-auth": orchestrator_token(fleet["key"], request_type, np.array([ids], np.int32), time.time())}


def test_the_workers_speak_trtllm_serves_disaggregated_protocol(serve_fleet):
    """context_only: not streamed, prompt_token_ids, one choice with disaggregated_params and finish_reason
    not_finished; generation_only with those params: the stream starts with first_gen_tokens again."""
    ids = [1, 450, 496, 173, 170, 432, 1204, 975, 278]
    body = {"model": "tiny-llama", "prompt": ids, "max_tokens": 5, "temperature": 0, "detokenize": False}
    r = httpx.post(f"{serve_fleet['ctx'].url}/v1/completions", timeout=60, headers=_auth(serve_fleet, "context_only", ids),
                   json={**body, "disaggregated_params": {"request_type": "context_only"}})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "text_completion" and answer["prompt_token_ids"] == ids
    (choice,) = answer["choices"]
    params = choice["disaggregated_params"]
    assert choice["finish_reason"] == "not_finished" and choice["token_ids"] == params["first_gen_tokens"]
    assert params["request_type"] == "context_only" and isinstance(params["ctx_request_id"], int)
    assert len(params["first_gen_tokens"]) == 1 and params["encoded_opaque_state"]
    gen_body = {**body, "prompt": answer["prompt_token_ids"], "stream": True,
                "disaggregated_params": {**params, "request_type": "generation_only"}}
    with httpx.stream("POST", f"{serve_fleet['gen'].url}/v1/completions", json=gen_body, timeout=60,
                      headers=_auth(serve_fleet, "generation_only", ids)) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        lines = [line[5:].strip() for line in s.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    tokens = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert tokens[0] == params["first_gen_tokens"][0] and len(tokens) == 5
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def _metric(fleet, text: str) -> float:
    """A sample's value from the gateway's /metrics (0 if absent)."""
    from prometheus_client.parser import text_string_to_metric_families
    name, _, labels = text.partition("{")
    want = dict(kv.split("=") for kv in labels.rstrip("}").replace('"', "").split(",")) if labels else {}
    body = httpx.get(f"{fleet['gateway'].url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in want.items()):
                return sample.value
    return 0.0


def test_the_ttft_breakdown_over_trtllm_serve_comes_from_the_workers_perf_metrics(serve_fleet):
    """Each worker keeps a record per finished request (return_perf_metrics), handed out once at /perf_metrics in
    upstream's shape, matched by ctx_request_id: the context worker's without KV fields, the generation worker's
    with the bytes it pulled. Through the gateway the same records become the TTFT breakdown (prefill queue and
    compute, decode queue, KV transfer and bytes) in its metrics and samples, read after each request finished."""
    ids = list(range(3, 3 + 40))
    body = {"model": "tiny-llama", "prompt": ids, "max_tokens": 3, "temperature": 0, "detokenize": False}
    r = httpx.post(f"{serve_fleet['ctx'].url}/v1/completions", timeout=60, headers=_auth(serve_fleet, "context_only", ids),
                   json={**body, "disaggregated_params": {"request_type": "context_only"}})
    params = r.json()["choices"][0]["disaggregated_params"]
    r = httpx.post(f"{serve_fleet['gen'].url}/v1/completions", timeout=60, headers=_auth(serve_fleet, "generation_only", ids),
                   json={**body, "disaggregated_params": {**params, "request_type": "generation_only"}})
    assert r.status_code == 200, r.text
    kv_bytes = get_model("tiny-llama").kv_bytes_per_request(len(ids), "fp16")
    records = {}
    for worker in ("ctx", "gen"):
        got = [x for x in httpx.get(f"{serve_fleet[worker].url}/perf_metrics", timeout=10).json()
               if x.get("ctx_request_id") == params["ctx_request_id"]]
        assert len(got) == 1, got
        records[worker] = got[0]["perf_metrics"]
        assert {"first_iter", "last_iter", "timing_metrics", "kv_cache_metrics"} <= set(records[worker])
    ctx_t, gen_t = records["ctx"]["timing_metrics"], records["gen"]["timing_metrics"]
    assert "kv_cache_size" not in ctx_t
    assert ctx_t["arrival_time"] <= ctx_t["first_scheduled_time"] <= ctx_t["first_token_time"]
    assert gen_t["kv_cache_size"] == kv_bytes
    assert gen_t["arrival_time"] <= gen_t["kv_cache_transfer_start"] <= gen_t["kv_cache_transfer_end"] \
        <= gen_t["first_token_time"] <= gen_t["last_token_time"]
    assert [x for x in httpx.get(f"{serve_fleet['gen'].url}/perf_metrics", timeout=10).json()
            if x.get("ctx_request_id") == params["ctx_request_id"]] == []         # handed out once
    assert httpx.get(f"{serve_fleet['colo'].url}/perf_metrics", timeout=10).json() == []   # not enabled there

    before = {phase: _metric(serve_fleet, f'trtpd_gateway_ttft_breakdown_seconds_count{{phase="{phase}"}}')
              for phase in ("prefill_queue", "prefill_compute", "kv_transfer", "decode_queue")}
    bytes_before = _metric(serve_fleet, "trtpd_gateway_kv_transfer_bytes_total")
    since = time.time() - 1
    client = openai.OpenAI(base_url=f"{serve_fleet['gateway'].url}/v1", api_key="unused", max_retries=0)
    prompts = _prompts(serve_fleet["root"], [30, 300])
    want_bytes = 0
    for prompt in prompts:
        got = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=3, temperature=0)
        want_bytes += get_model("tiny-llama").kv_bytes_per_request(got.usage.prompt_tokens, "fp16")
    deadline = time.monotonic() + 10      # recorded once the workers' records are read, after each response
    while _metric(serve_fleet, "trtpd_gateway_kv_transfer_bytes_total") - bytes_before < want_bytes:
        assert time.monotonic() < deadline, "the gateway recorded no KV transfer from the workers' records"
        time.sleep(0.1)
    assert _metric(serve_fleet, "trtpd_gateway_kv_transfer_bytes_total") - bytes_before == want_bytes
    for phase, count in before.items():
        assert _metric(serve_fleet, f'trtpd_gateway_ttft_breakdown_seconds_count{{phase="{phase}"}}') == count + 2
    samples = [x for x in _samples(serve_fleet, since) if x["ok"]]
    assert len(samples) >= 2 and all(x["prefill_queue_s"] is not None and x["decode_queue_s"] is not None
                                     for x in samples[-2:])


def test_worker_errors_are_flat_400_error_responses_and_requests_need_the_orchestrators_proof(serve_fleet):
    ctx = serve_fleet["ctx"].url
    r = httpx.post(f"{ctx}/v1/completions", timeout=30, json={"model": "tiny-llama", "prompt": [1, 2], "bogus": 1})
    body = r.json()
    assert r.status_code == 400 and body["object"] == "error" and body["type"] == "BadRequestError"
    assert body["code"] == 400 and "bogus" in body["message"]
    r = httpx.post(f"{ctx}/v1/completions", timeout=30, json={
        "model": "tiny-llama", "prompt": [1, 2], "disaggregated_params": {"request_type": "context_only"}})
    assert r.status_code == 403 and "permission denied" in r.json()["message"].lower()
    # a forged opaque state: the generation worker refuses it before any KV is pulled
    ids = [1, 2, 3]
    r = httpx.post(f"{serve_fleet['gen'].url}/v1/completions", timeout=30,
                   headers=_auth(serve_fleet, "generation_only", ids),
                   json={"model": "tiny-llama", "prompt": ids, "max_tokens": 2, "disaggregated_params": {
                       "request_type": "generation_only", "first_gen_tokens": [5], "ctx_request_id": 9,
                       "encoded_opaque_state": "VFBESAAAAA=="}})
    assert r.status_code == 400 and r.json()["object"] == "error"


def test_metrics_are_iteration_stats_handed_out_once_and_only_when_enabled(serve_fleet, tmp_path):
    """/metrics: the iteration stats since the last read (a JSON list, drained by the read), and [] without
    enable_iter_perf_stats. A worker no gateway probes, so that no other reader takes them first."""
    prompt = _prompts(serve_fleet["root"], [20])[0]
    _colocated(serve_fleet, prompt, 2)
    assert httpx.get(f"{serve_fleet['colo'].url}/metrics", timeout=10).json() == []
    (tmp_path / "stats.yaml").write_text("enable_iter_perf_stats: true\n")
    worker = twin(tmp_path, "stats", serve_fleet["root"], "--extra_llm_api_options", str(tmp_path / "stats.yaml"))
    try:
        assert httpx.get(f"{worker.url}/metrics", timeout=10).json() == []      # no iteration yet
        r = httpx.post(f"{worker.url}/v1/completions", timeout=60,
                       json={"model": "tiny-llama", "prompt": prompt, "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200
        stats = httpx.get(f"{worker.url}/metrics", timeout=10).json()
        assert [s["iter"] for s in stats] == [1, 2, 3]       # a prefill-and-first-token step, then two decode steps
        for entry in stats:
            assert {"numActiveRequests", "numQueuedRequests", "maxNumActiveRequests", "kvCacheStats"} <= set(entry)
            assert {"maxNumBlocks", "freeNumBlocks", "usedNumBlocks", "tokensPerBlock"} <= set(entry["kvCacheStats"])
        assert httpx.get(f"{worker.url}/metrics", timeout=10).json() == []      # handed out once
        assert httpx.get(f"{worker.url}/version", timeout=10).json() == {"version": "1.2.1"}
    finally:
        worker.stop()


def test_a_client_that_goes_away_aborts_its_request(serve_fleet, tmp_path):
    """upstream's await_disconnected / a streamed body closed early: the request is aborted in the engine, which
    stops stepping it (no iteration stats after the abort) and frees its KV (a later request is alone in the
    engine, all but its own blocks free). Each step of this worker pauses 100 ms, so a 200-token request would run
    for 20 s: long enough for a disconnect to land in it."""
    (tmp_path / "stats.yaml").write_text("enable_iter_perf_stats: true\n")
    worker = twin(tmp_path, "slow", serve_fleet["root"], "--extra_llm_api_options", str(tmp_path / "stats.yaml"),
                  "--twin_step_delay_ms", "100")
    body = {"model": "tiny-llama", "prompt": list(range(3, 103)), "max_tokens": 200, "temperature": 0,
            "ignore_eos": True, "detokenize": False}

    def quiet_after_abort() -> dict:
        deadline = time.monotonic() + 10
        while True:      # until a whole second passes without a step
            httpx.get(f"{worker.url}/metrics", timeout=10)
            time.sleep(1.0)
            stats = httpx.get(f"{worker.url}/metrics", timeout=10).json()
            if not stats:
                break
            assert time.monotonic() < deadline, f"the request still runs: {stats[-1]}"
        r = httpx.post(f"{worker.url}/v1/completions", timeout=60, json={**body, "max_tokens": 2})
        assert r.status_code == 200
        return httpx.get(f"{worker.url}/metrics", timeout=10).json()[0]    # after its first step: still running
    try:
        with httpx.stream("POST", f"{worker.url}/v1/completions", json={**body, "stream": True}, timeout=60) as s:
            lines = s.iter_lines()
            while not next(lines).startswith("data:"):
                pass           # the first token: the request runs; leaving the block closes the connection
        alone = quiet_after_abort()
        kv = alone["kvCacheStats"]
        assert alone["numActiveRequests"] == 1 and kv["maxNumBlocks"] - kv["freeNumBlocks"] <= 8   # its own 102 tokens
        with pytest.raises(httpx.ReadTimeout):   # not streamed: the worker notices within a second
            httpx.post(f"{worker.url}/v1/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
        alone = quiet_after_abort()
        assert alone["numActiveRequests"] == 1
    finally:
        worker.stop()


def _samples(fleet, since: float) -> list[dict]:
    from trtpd.kv.auth import gateway_admin_token
    r = httpx.get(f"{fleet['gateway'].url}/admin/requests", params={"since": since}, timeout=10,
                  headers={"Authorization": f"Bearer {gateway_admin_token(fleet['key'])}"})
    return r.json()["requests"]


def _health(fleet) -> dict:
    return {i["name"]: i for i in httpx.get(f"{fleet['gateway'].url}/health", timeout=10).json()["instances"]}


def test_a_worker_that_registers_is_routed_to_and_one_that_leaves_is_not(serve_fleet, tmp_path):
    """Dynamic membership: a generation worker started later registers with the gateway as its disagg cluster
    (trtllm-serve's --disagg_cluster_uri, POST /set, heartbeats), is routed to once its probe answers, and when it
    stops it deregisters (DELETE) and gets nothing more; requests keep succeeding throughout. A worker without the
    deployment's cluster token is refused."""
    from trtpd.kv.auth import cluster_token

    gateway = serve_fleet["gateway"].url
    refused = httpx.post(f"{gateway}/cluster/set", timeout=10, json={
        "key": "/trtllm-disagg//workers/GENERATION-127.0.0.1:9-1-2-003",
        "value": json.dumps({"worker_id": "x", "host": "127.0.0.1", "port": 9, "role": 1})})
    assert refused.status_code == 401
    key = next(tmp_path.parent.glob("serve-twin*/deployment.key"))
    (tmp_path / "stats.yaml").write_text("enable_iter_perf_stats: true\n")   # the gateway's probe reads them
    gen2 = twin(tmp_path, "gen2", serve_fleet["root"], "--server_role", "GENERATION", "--host", "127.0.0.1",
                "--twin_key_file", str(key), "--extra_llm_api_options", str(tmp_path / "stats.yaml"),
                "--disagg_cluster_uri", f"{gateway}/cluster")
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)
    prompt = _prompts(serve_fleet["root"], [24])[0]
    want = _colocated(serve_fleet, prompt, 4)["choices"][0]["text"]
    name = f"decode@127.0.0.1:{gen2.port}"
    try:
        deadline = time.monotonic() + 30
        while _health(serve_fleet).get(name, {}).get("state") != "ready":
            assert time.monotonic() < deadline, _health(serve_fleet)
            time.sleep(0.1)
        info = httpx.get(f"{gateway}/cluster_info", timeout=10,
                         headers={"Authorization": f"Bearer {cluster_token(serve_fleet['key'])}"}).json()
        assert [w["name"] for w in info["current_workers"]["generation_servers"]] == [name] and info["is_ready"]
        since = time.time()
        for _ in range(8):
            assert client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=4,
                                             temperature=0).choices[0].text == want
        # which instance served each request: the gateway's samples (its probe drains the worker's /metrics)
        served = {r["decode_instance"] for r in _samples(serve_fleet, since)}
        assert name in served, served
    finally:
        gen2.stop()
    deadline = time.monotonic() + 15
    while _health(serve_fleet).get(name, {}).get("state") == "ready":    # one read: it may vanish in between
        assert time.monotonic() < deadline
        time.sleep(0.1)
    since = time.time()
    for _ in range(4):
        assert client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=4,
                                         temperature=0).choices[0].text == want
    assert {r["decode_instance"] for r in _samples(serve_fleet, since)} == {"decode-0"}


def _trtpd(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtpd.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def _stream(client, prompt: str, max_tokens: int) -> tuple[str, str | None, float]:
    """(text, error or None, seconds) of one streamed completion."""
    started, text = time.monotonic(), ""
    try:
        for chunk in client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=max_tokens,
                                               temperature=0, stream=True):
            text += chunk.choices[0].text if chunk.choices else ""
    except openai.APIError as exc:
        return text, f"{type(exc).__name__}: {exc}", time.monotonic() - started
    return text, None, time.monotonic() - started


def test_trtpd_up_starts_a_trtllm_serve_fleet_that_outlives_killed_workers(serve_fleet, tmp_path):
    """`trtpd up --fleet --backend trtllm-serve --prefill 3 --decode 2`: twin workers and the gateway; the openai
    client gets the colocated engine's text. SIGKILL of a context worker under 8 streams of ~700-token prompts:
    what it had not handed over is prefilled again on another. A context worker killed after it answered, before
    the generation worker pulled its KV: the pull fails with trtllm-serve's 400, whose words do not say so; the
    gateway's orchestrator sees the context worker gone and prefills again elsewhere. SIGKILL of the generation
    worker serving a stream ends that stream with an error naming it; `trtpd down` stops all."""
    from concurrent.futures import ThreadPoolExecutor

    from trtpd.process_identity import is_running

    env = {**os.environ, "TRTPD_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    up = _trtpd("up", "--fleet", "--backend", "trtllm-serve", "--prefill", "3", "--decode", "2", "--name", "ts",
                "--no-auth", "--engines", str(serve_fleet["root"]), env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    record = json.loads((tmp_path / "home" / "deployments" / "ts" / "fleet.json").read_text())
    pids = {i["name"]: (i["server"]["pid"], i["server"]["start_time"]) for i in record["instances"]}
    try:
        assert {i["protocol"] for i in record["instances"]} == {"trtllm-serve"} and len(pids) == 5
        gateway = f"http://127.0.0.1:{record['gateway']['port']}"
        client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=60)
        prompts = _prompts(serve_fleet["root"], [700 + 13 * i for i in range(8)])
        expected = [_colocated(serve_fleet, p, 24)["choices"][0]["text"] for p in prompts]
        assert [client.completions.create(model="tiny-llama", prompt=p, max_tokens=24, temperature=0)
                .choices[0].text for p in prompts[:2]] == expected[:2]

        def holds(name: str) -> int:
            return {i["name"]: i["gateway_holds"] for i in
                    httpx.get(f"{gateway}/health", timeout=10).json()["instances"]}.get(name, 0)
        with ThreadPoolExecutor(len(prompts)) as pool:
            futures = [pool.submit(_stream, client, p, 24) for p in prompts]
            deadline = time.monotonic() + 30
            while not holds("prefill-0"):
                assert time.monotonic() < deadline, "prefill-0 got none of the requests"
                time.sleep(0.005)
            os.kill(pids["prefill-0"][0], signal.SIGKILL)
            results = [f.result(timeout=90) for f in futures]
        errors = [err for _, err, _ in results if err is not None]
        print(f"SIGKILL prefill-0 under 8 streams: {8 - len(errors)} completed, errors {errors}")
        assert all(text == expected[i] for i, (text, err, _) in enumerate(results) if err is None)
        assert len(errors) <= 2 and all("instance" in err for err in errors), errors
        _kv_pull_from_a_dead_context_worker(record, pids, prompts[0], expected[0])
        # a generation worker dies under a stream it serves
        stream = client.completions.create(model="tiny-llama", prompt=prompts[0], max_tokens=400, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        serving = next(n for n in ("decode-0", "decode-1") if holds(n))
        os.kill(pids[serving][0], signal.SIGKILL)
        with pytest.raises(openai.APIError) as broken:
            for _ in stream:
                pass
        assert serving in str(broken.value)
        for i in range(3):     # the survivors serve what comes next
            assert client.completions.create(model="tiny-llama", prompt=prompts[i], max_tokens=24,
                                             temperature=0).choices[0].text == expected[i]
    finally:
        down = _trtpd("down", "--name", "ts", env=env)
        _kill_leftovers(record, pids)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(is_running(pid, started) for pid, started in pids.values())


def _kill_leftovers(record: dict, pids: dict) -> None:
    """Whatever `trtpd down` left running (it failed, or the test did before it): the workers, the gateway and its
    supervisord, by pid and start time, so the next test starts on an empty machine."""
    from trtpd.process_identity import signal_exact
    others = [(int(p["pid"]), p.get("start_time")) for p in (record.get("gateway"), record.get("supervisor")) if p]
    for pid, started in [*pids.values(), *others]:
        signal_exact(pid, started, signal.SIGKILL)


def _kv_pull_from_a_dead_context_worker(record: dict, pids: dict, prompt: str, expected: str) -> None:
    """prefill-1 answers a context request, then is SIGKILLed before decode-0 pulls. decode-0 answers trtllm-serve's
    400 (its KV pull failed); the gateway's orchestrator (here in this process, over the same transports and
    probes) finds prefill-1 gone and prefills again on prefill-2, so the request completes."""
    import asyncio

    from trtpd.engine.text_tokenizers import load_text_tokenizer
    from trtpd.kv.handle import load_or_create_key_file
    from trtpd.orchestration.orchestrator import Orchestrator
    from trtpd.orchestration.transport import RoleChunk, RoleError, SamplingInputs
    from trtpd.routing.core import InstanceView, Router, RoutingPolicy
    from trtpd.transports.trtllm_http import ServeClient

    key = load_or_create_key_file(record["key_file"])
    by_name = {i["name"]: i for i in record["instances"]}
    clients = {n: ServeClient(n, by_name[n]["http_url"], "tiny-llama", key) for n in ("prefill-1", "prefill-2",
                                                                                        "decode-0")}
    ids = load_text_tokenizer(record["tokenizer_dir"]).encode(prompt)
    sampling = SamplingInputs(max_new_tokens=24, end_id=2)

    class Answered:
        """prefill-1 as the orchestrator meets it: it answered (for real, before it was killed), then it is gone."""
        name = "prefill-1"

        def __init__(self, chunk: RoleChunk) -> None:
            self.chunk = chunk

        async def stream(self, *args, **kwargs):
            yield self.chunk

        async def close(self) -> None:
            await clients["prefill-1"].close()

    async def go():
        answer = [c async for c in clients["prefill-1"].stream("ctx", "context_only", ids, sampling)][-1]
        os.kill(pids["prefill-1"][0], signal.SIGKILL)
        with pytest.raises(RoleError) as pull:     # what the generation worker says: a 400, "internal"
            async for _ in clients["decode-0"].stream("gen", "generation_only", ids, sampling, answer.handle):
                pass
        assert pull.value.kind == "internal" and not pull.value.transport and "HTTP 400" in str(pull.value)
        router = Router(RoutingPolicy())
        router.update([InstanceView("prefill-1", "prefill"), InstanceView("prefill-2", "prefill", waiting=5),
                       InstanceView("decode-0", "decode", free_kv_blocks=100, max_kv_blocks=100)], 0.0)

        async def alive(name: str) -> bool:
            return (await clients[name].probe("prefill")).state != "unhealthy"
        orchestrator = Orchestrator("disaggregated", router, {**clients, "prefill-1": Answered(answer)}, alive=alive)
        steps = [s async for s in orchestrator.generate("r", ids, sampling)]
        for c in clients.values():
            await c.close()
        return steps
    steps = asyncio.run(go())
    tokenizer = load_text_tokenizer(record["tokenizer_dir"])
    assert tokenizer.decode([t for s in steps for t in s.token_ids]) == expected
    assert {s.prefill_instance for s in steps if s.token_ids} == {"prefill-2"}


def test_the_gateway_over_trtllm_serve_gives_no_server_error_to_generated_requests(serve_fleet):
    """schemathesis over the gateway's OpenAPI document with the trtllm-serve transport behind it: whatever passes
    the gateway's checks must also be something a worker takes (a worker's 400 would reach the client as a 500)."""
    checked = fuzz_openapi(serve_fleet["gateway"].url, None, 25)
    assert any(code == 200 for code in checked)
    print(f"schemathesis: {len(checked)} generated requests, status codes {sorted(set(checked))}")
