"""End-to-end tier: the real tritonserver binary with the rendered repository, real role processes,
real KV transport. The shared deployments start once per session, when a test first needs one, and stop after
the last test that uses it (pytest_runtest_teardown below): idle, each still takes ~5% of a core (its stubs'
watches, Triton's metrics), which the rest of the suite would pay for on 2 cores."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from trtpd.bench.client import BenchRequest, run_stream
from trtpd.deploy.spec import KEY_FILE, ReferenceDeployment
from trtpd.repo.reference import render_reference_repository
from trtpd.fleet import deployment
from trtpd.fleet.tritonserver import start_server, stop_server, wait_ready

pytestmark = pytest.mark.e2e
ROLE_MODELS = ("prefill", "decode", "colocated")


@pytest.fixture(scope="session")
def trtpd_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("trtpd-home")
    old = os.environ.get("TRTPD_HOME")
    os.environ["TRTPD_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("TRTPD_HOME", None)
    else:
        os.environ["TRTPD_HOME"] = old


class Server:
    """A running deployment plus the client calls the tests make."""

    def __init__(self, server, name: str):
        self.server = server
        self.name = name

    @property
    def grpc_url(self) -> str:
        return self.server.grpc_url

    def generate(self, body: dict, stream: bool = False) -> tuple[int, list[dict]]:
        path = "generate_stream" if stream else "generate"
        req = urllib.request.Request(f"http://{self.server.http_url}/v2/models/ensemble/{path}",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, [json.loads(exc.read().decode() or "{}")]
        if stream:
            return status, [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
        return status, [json.loads(text)]

    def stream(self, prompts: dict[str, str], max_tokens: int, timeout_s: float = 300.0):
        reqs = [BenchRequest(rid, text, max_tokens, 0.0) for rid, text in prompts.items()]
        return {r.request_id: r for r in run_stream(self.grpc_url, reqs, timeout_s=timeout_s)}

    def orchestrator_auth(self, request_type: str, input_ids) -> dict:
        """The trtpd_auth parameter the BLS would add (role models refuse requests without it)."""
        from trtpd.kv.auth import AUTH_PARAMETER, orchestrator_token
        from trtpd.kv.handle import load_or_create_key_file
        repo = Path(self.server.repo)
        key = load_or_create_key_file(repo.parent / f"{repo.name}.{KEY_FILE}")
        return {AUTH_PARAMETER: orchestrator_token(key, request_type, input_ids, time.time())}

    def call(self, model: str, tensors: dict[str, np.ndarray], parameters: dict | None = None,
             timeout_s: float = 60.0, auth: bool = True) -> list:
        """One request on a decoupled model over the gRPC stream; returns its responses (or raises).
        Requests to the role models carry the orchestrator's proof unless auth=False."""
        parameters = dict(parameters or {})
        if auth and model in ROLE_MODELS:
            parameters.update(self.orchestrator_auth(str(parameters.get("request_type", "")),
                                                     tensors.get("input_ids")))
        responses: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.grpc_url)
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        inputs = []
        for name, value in tensors.items():
            dtype = {np.int32: "INT32", np.uint8: "UINT8", np.bool_: "BOOL", np.object_: "BYTES",
                     np.int64: "INT64", np.float32: "FP32"}[value.dtype.type]
            t = grpcclient.InferInput(name, list(value.shape), dtype)
            t.set_data_from_numpy(value)
            inputs.append(t)
        client.async_stream_infer(model, inputs, request_id="e2e", parameters=parameters,
                                  enable_empty_final_response=True)
        out = []
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                result, error = responses.get(timeout=max(0.1, deadline - time.monotonic()))
                if error is not None:
                    raise RuntimeError(str(error))
                out.append(result)
                final = result.get_response().parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return out
            raise TimeoutError(f"{model}: no final response in {timeout_s} s")
        finally:
            client.stop_stream(cancel_requests=True)
            client.close()

    def metrics(self) -> dict[tuple, float]:
        text = urllib.request.urlopen(self.server.metrics_url, timeout=5).read().decode()
        values = {}
        for line in text.splitlines():
            if line.startswith("#") or "{" not in line:
                continue
            name = line[:line.index("{")]
            labels = line[line.index("{") + 1:line.rindex("}")]
            fields = tuple(sorted(tuple(p.split("=", 1)) for p in labels.split(",") if "=" in p))
            values[(name, tuple((k, v.strip('"')) for k, v in fields))] = float(line.rsplit(" ", 1)[1])
        return values

    def kv_blocks(self, model: str, kind: str = "free") -> float:
        for (name, labels), value in self.metrics().items():
            d = dict(labels)
            if name == "nv_trt_llm_kv_cache_block_metrics" and d.get("model") == model \
                    and d.get("kv_cache_block_type") == kind:
                return value
        raise KeyError(f"no KV block metric for {model}/{kind}")

    def idle_blocks(self, model: str, timeout_s: float = 20.0) -> float:
        """The free-block baseline a test starts from: every block free. Waits for it, because the metrics lag
        the engine by up to 0.1 s and an earlier test's last request may still be finishing."""
        total = self.kv_blocks(model, "max")
        self.wait_blocks(model, total, timeout_s)
        return total

    def wait_blocks(self, model: str, expected: float, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            last = self.kv_blocks(model)
            if last == expected:
                return
            time.sleep(0.1)
        raise AssertionError(f"{model}: {last} free KV blocks after {timeout_s} s, expected {expected}")


# the shared deployments' session fixtures -> how to stop each while it runs (called once, early or at the end)
_STOP: dict[str, Callable[[], None]] = {}
SHARED_DEPLOYMENTS = ("fp16_disagg", "fp16_coloc", "fp8_disagg", "fp8_coloc", "mismatched")


def _stop_once(fixture: str, stop: Callable[[], None]) -> Callable[[], None]:
    def once() -> None:
        if _STOP.pop(fixture, None) is not None:
            stop()
    _STOP[fixture] = once
    return once


def _deployed(fixture: str, name: str, spec: ReferenceDeployment):
    """Body of a session fixture: start the deployment, hand it to the tests, stop it (if still running)."""
    dep = deployment.up(name, spec, replace=True)
    stop = _stop_once(fixture, lambda: deployment.down(name))
    try:
        yield Server(dep.server, name)
    finally:
        stop()


# fixtures that may hand a test a shared deployment by request.getfixturevalue (test_equivalence.py's "shm")
INDIRECT_USERS = {"fp16_disagg_over": "fp16_disagg"}


def _uses(item: pytest.Item) -> set[str]:
    """The shared deployments a test may use: its fixtures (with those they depend on), the fixtures that get
    one by name, and parameter values that name one (tests that call request.getfixturevalue(server_name))."""
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        names |= {v for v in callspec.params.values() if isinstance(v, str)}
    names |= {INDIRECT_USERS[n] for n in names if n in INDIRECT_USERS}
    return names & set(SHARED_DEPLOYMENTS)


def _last_users(items: list[pytest.Item]) -> dict[str, str]:
    """Each shared deployment's fixture -> the id of the last test to run that may use it."""
    return {fixture: item.nodeid for item in items for fixture in _uses(item)}


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The test files that use a shared deployment run first (each file whole, in its own order; the other files
    keep theirs), so that the shared deployments are stopped before the long fleet and controller tests."""
    here = Path(__file__).resolve().parent
    mine = [i for i in items if here in Path(i.path).resolve().parents]
    users = {i.path for i in mine if _uses(i)}
    ordered = iter([i for i in mine if i.path in users] + [i for i in mine if i.path not in users])
    chosen = set(mine)
    items[:] = [next(ordered) if i in chosen else i for i in items]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test that uses a shared deployment (its own fixtures torn down), stop that deployment."""
    session = item.session
    last = getattr(session, "_trtpd_last_users", None)
    if last is None:
        last = session._trtpd_last_users = _last_users(session.items)
    for fixture, nodeid in last.items():
        if nodeid == item.nodeid and fixture in _STOP:
            _STOP[fixture]()


@pytest.fixture(scope="session")
def fp16_disagg(trtpd_home, fp16_root):
    yield from _deployed("fp16_disagg", "e2e-fp16-disagg", ReferenceDeployment(fp16_root, mode="disaggregated"))


@pytest.fixture(scope="session")
def fp16_coloc(trtpd_home, fp16_root):
    yield from _deployed("fp16_coloc", "e2e-fp16-coloc",
                         ReferenceDeployment(fp16_root, mode="colocated", colocated_instances=2))


@pytest.fixture(scope="session")
def fp8_disagg(trtpd_home, fp8_root):
    yield from _deployed("fp8_disagg", "e2e-fp8-disagg",
                         ReferenceDeployment(fp8_root, mode="disaggregated", kv_transport="tcp"))


@pytest.fixture(scope="session")
def fp8_coloc(trtpd_home, fp8_root):
    yield from _deployed("fp8_coloc", "e2e-fp8-coloc",
                         ReferenceDeployment(fp8_root, mode="colocated", colocated_instances=1))


@pytest.fixture(scope="session")
def mismatched(trtpd_home, fp16_root, fp8_root, tmp_path_factory):
    """fp16 prefill + fp8 decode (forced past the render-time check) with a short KV timeout."""
    spec = ReferenceDeployment(fp16_root, decode_engine=fp8_root / "decode-tp1", kv_transfer_timeout_ms=1500)
    folder = tmp_path_factory.mktemp("mismatch")
    repo = render_reference_repository(spec, folder / "repo", check_compatibility=False)
    server = start_server(repo, folder)
    stop = _stop_once("mismatched", lambda: stop_server(server))
    try:
        wait_ready(server, 180)
        yield Server(server, "mismatch")
    finally:
        stop()


@pytest.fixture(scope="session")
def tokenizer(fp16_root):
    from trtpd.engine.checkpoint import load_checkpoint
    return load_checkpoint(fp16_root / "checkpoint").load_tokenizer()


@contextlib.contextmanager
def fleet_with_gateway(name: str, spec: ReferenceDeployment, **counts):
    """A fleet (each instance its own tritonserver) behind the OpenAI gateway, stopped (every process, by pid)
    on the way out."""
    from trtpd.fleet.gateway_process import attach_gateway
    from trtpd.fleet.launcher import fleet_down, fleet_up

    fleet = fleet_up(name, spec, replace=True, **counts)
    try:
        yield attach_gateway(fleet)
    finally:
        fleet_down(name)


def gateway_key(fleet) -> str:
    """The API key of the fleet's gateway (attach_gateway made the deployment's api.key)."""
    from trtpd.fleet.gateway_process import api_key
    return api_key(fleet)


def auth(fleet) -> dict[str, str]:
    return {"Authorization": f"Bearer {gateway_key(fleet)}"}


def gateway_url(fleet, path: str = "") -> str:
    return f"http://127.0.0.1:{fleet.gateway['port']}{path}"


@contextlib.contextmanager
def extra_gateway(fleet, folder: Path, *args: str, timeout_s: float = 60.0, max_open_files: int | None = None):
    """A second gateway process on the same fleet (no supervisor), with its own limits (and open-file limit);
    yields its port and pid, stops it by pid on the way out."""
    import resource
    import subprocess
    import sys

    from trtpd.fleet.instance import pick_port
    from trtpd.fleet.supervisor import stop_process
    from trtpd.process_identity import start_time

    folder.mkdir(parents=True, exist_ok=True)
    port = pick_port(set())
    cmd = [sys.executable, "-m", "trtpd.gateway", "--fleet-file", str(fleet.path), "--port", str(port),
           "--state-file", str(folder / "gateway.json"), "--api-key-file", fleet.gateway["api_key_file"], *args]
    with open(folder / "gateway.log", "ab") as log:
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))) \
            if max_open_files else None
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=limit)
    started = start_time(proc.pid)
    try:
        def healthy():
            assert proc.poll() is None, (folder / "gateway.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    return r.status == 200
            except (OSError, urllib.error.HTTPError):
                return False
        wait_for(healthy, timeout_s, "the extra gateway did not answer /health")
        yield port, proc.pid
    finally:
        stop_process(proc.pid, started, 10.0)
        proc.wait(timeout=10)


def wait_for(predicate, timeout_s: float, what: str) -> None:
    """Polls `predicate` every 0.1 s until it holds; fails saying `what` did not happen within the bound."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout_s} s")


def with_id(req: BenchRequest, rid: str) -> BenchRequest:
    return replace(req, request_id=rid)


def fuzz_openapi(base_url: str, headers: dict | None = None, max_examples: int = 30) -> list[int]:
    """schemathesis over a gateway's OpenAPI document: `max_examples` generated requests per operation
    (derandomized: the same cases every run); asserts none gets a 5xx, and that a refused POST to /v1/ says why in
    an OpenAI error body. Returns the status codes seen."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", headers=headers or {})
    checked: list[int] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            response = case.call(timeout=120, headers=headers or {})
            assert response.status_code < 500, f"{case.method} {case.path} {case.body!r} -> " \
                                               f"{response.status_code} {response.text[:300]}"
            if case.path.startswith("/v1/") and case.method == "POST" and response.status_code >= 400:
                assert response.json()["error"]["message"]   # an OpenAI error body that says what is wrong
            checked.append(response.status_code)
        check()
    return checked
