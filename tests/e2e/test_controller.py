"""The controller end to end: real tritonservers, the real gateway, the controller process, the official
`openai` client as the load. Scaling and healing under load, drain timeouts, and three rollouts.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from trtpd.cli.main import main as trtpd
from trtpd.cli.controller_client import open_store
from trtpd.controller.daemon import bring_up
from trtpd.fleet.gateway_process import api_key
from trtpd.fleet.records import load_fleet

pytestmark = pytest.mark.e2e

PROMPTS = [f"request {i}: " + "tell me about prefill and decode " * (1 + i % 5) for i in range(8)]
MAX_TOKENS = 12
LONG_TOKENS = 48


def write_spec(path: Path, name: str, build_root: Path, *, decode: str = "{instances: 1}",
               prefill: str = "{instances: 1}", engines_extra: str = "", rollout: str = "", slo: str = "",
               backend: str = "reference") -> Path:
    path.write_text(f"""name: {name}
model: tiny-llama
backend: {backend}
engines: {{build_root: {build_root}{engines_extra}}}
roles:
  prefill: {prefill}
  decode: {decode}
slo: {slo or '{ttft_s: 2.0, tpot_s: 0.1, attainment: 0.9}'}
rollout: {rollout or '{canary_share: 0.5, bake_s: 5, min_requests: 6, max_ttft_ratio: 4, max_tpot_ratio: 4, drain_timeout_s: 20}'}
""")
    return path


def client(name: str) -> OpenAI:
    fleet = load_fleet(name)
    return OpenAI(base_url=f"http://127.0.0.1:{fleet.gateway['port']}/v1", api_key=api_key(fleet), max_retries=0,
                  timeout=60)


def complete(c: OpenAI, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    stream = c.completions.create(model="tiny-llama", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                  stream=True)
    return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)


class Load:
    """`threads` clients sending the PROMPTS round robin (streaming, greedy) until stopped; bounded in time."""

    def __init__(self, c: OpenAI, threads: int = 2, max_s: float = 240.0, max_tokens: int = MAX_TOKENS) -> None:
        self.c, self.results, self.errors, self.max_tokens = c, [], [], max_tokens
        self._stop = threading.Event()
        self._deadline = time.monotonic() + max_s
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, i: int) -> None:
        n = i
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            prompt = PROMPTS[n % len(PROMPTS)]
            try:
                self.results.append((prompt, complete(self.c, prompt, self.max_tokens)))
            except Exception as exc:   # reported with its cause by the test
                self.errors.append((prompt, f"{type(exc).__name__}: {exc}"))
            n += len(self._threads)

    def served(self, more: int, timeout_s: float = 30.0) -> None:
        """Until `more` further requests have completed (the load is really running), or fails after timeout_s."""
        target, deadline = len(self.results) + more, time.monotonic() + timeout_s
        while len(self.results) < target:
            assert time.monotonic() < deadline, f"the load served {len(self.results)} of {target}; {self.errors}"
            time.sleep(0.05)

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(90)


def audit(name: str, action: str | None = None) -> list:
    return [e for e in open_store(name).audit_log() if action is None or e.action == action]


def wait_audit(name: str, predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [e for e in open_store(name).audit_log() if predicate(e)]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; audit: "
                         f"{[(e.action, e.detail) for e in open_store(name).audit_log()[-15:]]}")


def pids(name: str) -> dict[str, int]:
    return {i.name: i.server.pid for i in load_fleet(name).instances}


def counts(name: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in load_fleet(name).instances:
        out[i.role] = out.get(i.role, 0) + 1
    return out


@pytest.fixture
def deployment(trtpd_home, fp16_root, tmp_path):
    """A disaggregated deployment under its controller; stopped (controller first) after the test."""
    started = []

    def up(name: str, **spec) -> Path:
        path = write_spec(tmp_path / f"{name}.yaml", name, fp16_root, **spec)
        bring_up(path, progress=lambda *_: None)
        started.append(name)
        return path

    yield up
    for name in started:
        assert trtpd(["down", "--name", name]) == 0


def test_scale_under_load_keeps_every_request_and_its_greedy_output(deployment):
    deployment("scale")
    c = client("scale")
    reference = {p: complete(c, p) for p in PROMPTS}
    timings = {}
    with Load(c) as load:
        for target in ("prefill=2", "decode=2", "prefill=1", "decode=1"):
            time.sleep(1.0)
            started = time.monotonic()
            assert trtpd(["scale", "scale", target, "--timeout-s", "120"]) == 0
            timings[target] = time.monotonic() - started
            role, n = target.split("=")
            # converged in the store; a retired instance leaves fleet.json as its stop is carried out
            deadline = time.monotonic() + 10
            while counts("scale")[role] != int(n) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert counts("scale")[role] == int(n)
        time.sleep(1.0)
    print(f"scale timings (CLI, until converged): {timings}; {len(load.results)} requests under load")
    assert load.errors == []
    assert len(load.results) >= 20
    wrong = [(p, text) for p, text in load.results if text != reference[p]]
    assert wrong == [], f"{len(wrong)} responses differ from the unscaled greedy output"
    drained = audit("scale", "drained")
    assert sorted(e.detail["role"] for e in drained) == ["decode", "prefill"]   # drained, not killed
    assert not audit("scale", "drain_timeout")


def kill_and_wait_replaced(name: str, role: str, timeout_s: float = 60) -> tuple:
    """SIGKILLs the deployment's first `role` instance; returns (victim, seconds until a replacement was ready)."""
    victim = next(i for i in load_fleet(name).instances if i.role == role)
    killed_at = time.time()
    os.kill(victim.server.pid, signal.SIGKILL)
    ready = wait_audit(name, lambda e: e.action == "ready" and e.detail["role"] == role and e.ts > killed_at,
                       timeout_s, f"a replacement {role} instance")
    return victim, killed_at, ready.ts - killed_at


def test_sigkill_is_healed_and_prefill_requests_survive(deployment):
    deployment("heal")
    c = client("heal")
    reference = {p: complete(c, p) for p in PROMPTS}
    healing = {}
    with Load(c) as load:
        for role in ("prefill", "decode"):
            time.sleep(1.5)
            victim, killed_at, replaced_s = kill_and_wait_replaced("heal", role)
            failed = wait_audit("heal", lambda e: e.action == "failed" and e.detail["instance"] == victim.name,
                                5, f"{victim.name} recorded as failed")
            healing[role] = {"detected_s": round(failed.ts - killed_at, 2), "replaced_s": round(replaced_s, 2)}
            assert victim.name not in pids("heal")
        time.sleep(1.5)
    print(f"healing: {healing}; {len(load.results)} ok, errors: {load.errors}")
    for role, t in healing.items():
        assert t["replaced_s"] < 30, f"{role} replaced after {t['replaced_s']} s"
    # prefill's requests are prefilled again on the replacement; decode's streams in flight end with an error
    # naming the instance (the client had part of the answer)
    assert all("decode" in cause and "failed" in cause for _, cause in load.errors), load.errors
    assert len(load.errors) <= 2
    assert [p for p, text in load.results if text != reference[p]] == []


@pytest.mark.parametrize("backend", ["reference", "trtllm-serve"])
def test_drain_timeout_ends_what_is_left_with_an_error(deployment, backend):
    name = f"drain-{backend}"      # one store per deployment name: each backend its own
    deployment(name, decode="{instances: 2, step_delay_ms: 40}",
               rollout="{drain_timeout_s: 2}", backend=backend)
    c = client(name)
    outcomes = []

    def long_request(i: int) -> None:
        try:
            outcomes.append(("ok", complete(c, PROMPTS[i], max_tokens=150)))
        except Exception as exc:
            outcomes.append(("error", f"{type(exc).__name__}: {exc}"))

    threads = [threading.Thread(target=long_request, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20   # both decode instances hold one stream each (least-loaded routing)
    while time.monotonic() < deadline:
        health = httpx.get(f"http://127.0.0.1:{load_fleet(name).gateway['port']}/health").json()
        if sorted(v["gateway_holds"] for v in health["instances"] if v["role"] == "decode") == [1, 1]:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the two streams did not spread over the two decode instances: {health}")
    assert trtpd(["scale", name, "decode=1", "--timeout-s", "60"]) == 0
    for t in threads:
        t.join(60)
    timeout = audit(name, "drain_timeout")
    assert len(timeout) == 1 and timeout[0].detail["holds"] >= 1
    assert sorted(kind for kind, _ in outcomes) == ["error", "ok"], outcomes
    error = next(text for kind, text in outcomes if kind == "error")
    assert timeout[0].detail["instance"] in error and "failed mid-stream" in error


def test_rollouts_refused_rolled_back_promoted_undone(deployment, fp16_root, fp8_root, tmp_path, capsys):
    base = deployment("ro")
    c = client("ro")
    reference = {p: complete(c, p) for p in PROMPTS}
    incompatible = write_spec(tmp_path / "fp8-decode.yaml", "ro", fp16_root,
                              engines_extra=f", decode: {fp8_root / 'decode-tp1'}")
    slow = write_spec(tmp_path / "slow.yaml", "ro", fp16_root, decode="{instances: 1, step_delay_ms: 150}")
    good = write_spec(tmp_path / "good.yaml", "ro", fp16_root, decode="{instances: 1, max_batch_size: 32}")
    timeline = {}
    with Load(c) as load:
        before = pids("ro")
        assert trtpd(["rollout", str(incompatible)]) == 2
        out = capsys.readouterr().out
        assert "refused (nothing was started)" in out and "KV dtype differs: prefill fp16, decode fp8" in out
        assert pids("ro") == before

        started = time.monotonic()
        assert trtpd(["rollout", str(slow)]) == 1
        timeline["slow"] = time.monotonic() - started
        out = capsys.readouterr().out
        assert "rollout_rolling_back" in out and "TPOT p90" in out and "> SLO 100 ms" in out
        assert pids("ro") == before   # the stable instances never moved

        started = time.monotonic()
        assert trtpd(["rollout", str(good)]) == 0
        timeline["good"] = time.monotonic() - started
        after_good = pids("ro")
        assert after_good["prefill-0"] == before["prefill-0"]      # unchanged role kept, relabelled
        assert "decode-0" not in after_good

        started = time.monotonic()
        assert trtpd(["rollout", "--undo", "ro"]) == 0
        timeline["undo"] = time.monotonic() - started
        time.sleep(1.0)
    print(f"rollout timelines (s): {timeline}; {len(load.results)} requests, errors {load.errors}")
    assert load.errors == []
    assert [p for p, text in load.results if text != reference[p]] == []
    store = open_store("ro")
    statuses = [(r.number, r.status) for r in store.revisions()]
    assert statuses == [(1, "superseded"), (2, "refused"), (3, "rolled_back"), (4, "superseded"), (5, "promoted")]
    assert json.loads(json.dumps(store.revision(5).spec_json)) == store.revision(1).spec_json
    gate = next(e for e in audit("ro", "rollout_rolling_back") if e.revision == 3).detail["gate"]
    assert gate["canary"]["tpot_p_s"] > 0.1 and not gate["passed"]
    assert trtpd(["history", "ro"]) == 0
    history = capsys.readouterr().out
    for word in ("refused", "rolled_back", "promoted", "rollout_promoting", "rollout_refused", "drained"):
        assert word in history
    assert base.is_file()


def test_in_place_change_restarts_nothing(deployment, fp16_root, tmp_path, capsys):
    deployment("inplace")
    before = pids("inplace")
    changed = write_spec(tmp_path / "routing.yaml", "inplace", fp16_root,
                         slo="{ttft_s: 1.5, tpot_s: 0.1, attainment: 0.9}")
    text = changed.read_text() + "routing: {balance: round_robin, max_prefill_attempts: 3}\n"
    changed.write_text(text)
    assert trtpd(["rollout", str(changed)]) == 0
    out = capsys.readouterr().out
    assert "applied in place (no instance restarted)" in out and "routing.balance" in out and "[in_place]" in out
    assert pids("inplace") == before
    fleet = load_fleet("inplace")
    assert fleet.routing["balance"] == "round_robin" and fleet.routing["max_prefill_attempts"] == 3
    assert {i.revision for i in fleet.instances} == {2}
    assert complete(client("inplace"), PROMPTS[0])   # still serving
    capsys.readouterr()
    assert trtpd(["status", "--name", "inplace", "--json"]) == 0
    (view,) = json.loads(capsys.readouterr().out)
    assert view["controller"]["running"] and view["controller"]["stable_revision"] == 2
    assert view["controller"]["rollout"] is None


@pytest.mark.parametrize("backend", ["reference", "trtllm-serve"])
def test_a_killed_controller_and_gateway_are_restarted_audited_and_the_controller_heals(deployment, backend):
    """supervisord restarts the controller after SIGKILL; the restarted controller resumes from its store and heals
    an instance that died while no controller watched; a killed gateway is back on its port; every death and
    restart is in the audit log."""
    from trtpd.controller.daemon import controller_alive
    from trtpd.fleet.gateway_process import running_gateway
    name = f"resume-{backend}"
    deployment(name, backend=backend)
    store = open_store(name)
    first = controller_alive(store)
    victim = next(i for i in load_fleet(name).instances if i.role == "decode")
    killed_at = time.time()
    os.kill(int(first["pid"]), signal.SIGKILL)   # the controller dies; its instances keep serving
    os.kill(victim.server.pid, signal.SIGKILL)   # and an instance dies while no controller watches
    died = wait_audit(name, lambda e: e.action == "controller_died" and e.ts > killed_at, 30,
                      "the controller's death in the audit log")
    assert died.actor == "supervisord" and died.detail["pid"] in (int(first["pid"]), None)   # None: within 1 s
    restarted = wait_audit(name, lambda e: e.action == "controller_restarted" and e.ts > killed_at, 30,
                           "the controller's restart in the audit log")
    ready = wait_audit(name, lambda e: e.action == "ready" and e.ts > killed_at, 60, "the replacement")
    assert ready.detail["role"] == "decode" and ready.detail["instance"] != victim.name
    assert controller_alive(store)["pid"] == restarted.detail["pid"] != int(first["pid"])
    assert counts(name) == {"prefill": 1, "decode": 1}   # nothing started twice
    c = client(name)
    assert complete(c, PROMPTS[1])
    gateway = running_gateway(load_fleet(name).gateway)
    os.kill(gateway["pid"], signal.SIGKILL)
    wait_audit(name, lambda e: e.action == "gateway_restarted" and e.detail["pid"] != gateway["pid"], 30,
               "the gateway's restart in the audit log")
    deadline = time.monotonic() + 20
    while True:
        try:
            assert complete(client(name), PROMPTS[1])    # the same port, the same key
            break
        except Exception:   # noqa: BLE001 - connection refused until the new gateway listens
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    log = open_store(name).audit_log()
    gateway_died = next(e for e in log if e.action == "gateway_died")
    gateway_back = next(e for e in log if e.action == "gateway_restarted")
    print(f"controller SIGKILL -> died in the audit {died.ts - killed_at:.2f} s, restarted "
          f"{restarted.ts - killed_at:.2f} s, replacement decode ready {ready.ts - killed_at:.2f} s; gateway "
          f"SIGKILL -> restarted {gateway_back.ts - gateway_died.ts:.2f} s after its death was recorded")


def test_the_autoscaler_acts_on_live_metrics(deployment):
    # a TTFT SLO no prefill instance can meet: the autoscaler adds one (up to max), under load, losing nothing
    deployment("auto", slo="{ttft_s: 0.005, tpot_s: 0.5, attainment: 0.9}",
               rollout="{drain_timeout_s: 20}")
    spec_path = next(p for p in Path(os.environ["TRTPD_HOME"]).parent.glob("**/auto.yaml"))
    spec_path.write_text(spec_path.read_text() + "autoscaling: {enabled: true, mode: act, interval_s: 1, "
                         "cooldown_s: 0, min: {prefill: 1, decode: 1}, max: {prefill: 2, decode: 1}, budget_cpus: 3}\n")
    from trtpd.controller.spec import load_spec
    from trtpd.controller.store import actor
    store = open_store("auto")   # apply it as revision 2 (an in-place change: no instance restarts)
    new = load_spec(spec_path)
    n = store.add_revision(new.to_yaml(), new.spec_json(), str(spec_path), actor())
    assert trtpd(["history", "auto"]) == 0
    from trtpd.cli.controller_client import submit_and_wait
    assert submit_and_wait("auto", "rollout", {"revision": n})["in_place"]
    c = client("auto")
    with Load(c, threads=2) as load:
        decision = wait_audit("auto", lambda e: e.action == "autoscale", 60, "an autoscaler decision")
        wait_for_count = time.monotonic() + 30
        while counts("auto").get("prefill") != 2 and time.monotonic() < wait_for_count:
            time.sleep(0.2)
        time.sleep(1.0)
    assert decision.detail["changed"]["prefill"] == [1, 2], decision.detail
    assert "up to 2" in decision.detail["reasons"]["prefill"]   # the model (a 5 ms TTFT is out of reach) and the queue
    assert counts("auto") == {"prefill": 2, "decode": 1}
    assert load.errors == [] and len(load.results) > 5


def test_a_hung_instance_fails_its_health_checks_and_is_replaced(deployment):
    deployment("hung")
    victim = next(i for i in load_fleet("hung").instances if i.role == "decode")
    stopped_at = time.time()
    os.kill(victim.server.pid, signal.SIGSTOP)   # alive, but answers nothing
    try:
        failed = wait_audit("hung", lambda e: e.action == "failed" and e.detail["instance"] == victim.name, 60,
                            "the hung instance recorded as failed")
        assert "health checks failing" in failed.detail["reason"]
        assert failed.ts - stopped_at >= 5.0   # the grace period, not a single missed probe
        ready = wait_audit("hung", lambda e: e.action == "ready" and e.ts > stopped_at, 60, "its replacement")
        assert ready.detail["role"] == "decode"
    finally:
        try:
            os.kill(victim.server.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert complete(client("hung"), PROMPTS[2])
    assert victim.name not in pids("hung")


def test_a_rollout_changing_both_roles_kv_dtype_keeps_kv_within_each_revision(deployment, fp8_root, tmp_path):
    deployment("kvboth")
    c = client("kvboth")
    # fp16 -> fp8 for prefill and decode at once: the new revision's KV is incompatible with the old one's,
    # so only the cohort split (changed roles serve their own revision) keeps every pull within one revision
    both = write_spec(tmp_path / "fp8-both.yaml", "kvboth", fp8_root)
    with Load(c) as load:
        assert trtpd(["rollout", str(both)]) == 0
        time.sleep(1.0)
    assert load.errors == [], load.errors
    assert {i.revision for i in load_fleet("kvboth").instances} == {2}
    baked = next(e for e in audit("kvboth", "rollout_promoting"))
    assert baked.detail["gate"]["canary"]["requests"] >= 6 and baked.detail["gate"]["stable"]["requests"] >= 6


def test_a_trtllm_serve_deployment_scales_and_heals_under_load(deployment):
    """backend: trtllm-serve: the same executor starts trtllm-serve (CPU twin) workers instead of tritonservers.
    Under load: decode scaled 1 -> 2 -> 1 (drained, not killed) with every response equal to the unscaled greedy
    output, and a SIGKILLed prefill worker replaced, its requests prefilled again."""
    deployment("serve", backend="trtllm-serve")
    assert {i.protocol for i in load_fleet("serve").instances} == {"trtllm-serve"}
    c = client("serve")
    reference = {p: complete(c, p) for p in PROMPTS}
    timings = {}
    with Load(c) as load:
        for target in ("decode=2", "decode=1"):
            load.served(4)
            started = time.monotonic()
            assert trtpd(["scale", "serve", target, "--timeout-s", "120"]) == 0
            timings[target] = round(time.monotonic() - started, 2)
            deadline = time.monotonic() + 10
            while counts("serve")["decode"] != int(target[-1]) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert counts("serve")["decode"] == int(target[-1])
        load.served(4)
        victim, _, replaced_s = kill_and_wait_replaced("serve", "prefill")
        timings["prefill replaced"] = round(replaced_s, 2)
        load.served(4)      # the replacement serves
    print(f"trtllm-serve timings: {timings}; {len(load.results)} requests under load, errors {load.errors}")
    assert load.errors == []
    assert [p for p, text in load.results if text != reference[p]] == []
    assert [e.detail["role"] for e in audit("serve", "drained")] == ["decode"]
    assert victim.name not in pids("serve")


def test_rollouts_on_trtllm_serve_roll_back_a_slow_revision_and_promote_a_good_one(deployment, fp16_root, tmp_path,
                                                                                  capsys):
    """The same canary, SLO gate and rollback on backend: trtllm-serve: a revision whose decode worker is slow
    (step_delay_ms) is rolled back without moving the stable workers; a good one is promoted, keeping the unchanged
    prefill worker, then undone (`rollout --undo`: the first revision again); no request fails and every response is
    the greedy output."""
    deployment("rs", backend="trtllm-serve")
    c = client("rs")
    reference = {p: complete(c, p) for p in PROMPTS}
    slow = write_spec(tmp_path / "slow.yaml", "rs", fp16_root, decode="{instances: 1, step_delay_ms: 150}",
                      backend="trtllm-serve")
    good = write_spec(tmp_path / "good.yaml", "rs", fp16_root, decode="{instances: 1, max_batch_size: 32}",
                      backend="trtllm-serve")
    timeline = {}
    with Load(c) as load:
        before = pids("rs")
        started = time.monotonic()
        assert trtpd(["rollout", str(slow)]) == 1
        timeline["slow"] = round(time.monotonic() - started, 2)
        out = capsys.readouterr().out
        assert "rollout_rolling_back" in out and "TPOT p90" in out
        assert pids("rs") == before
        started = time.monotonic()
        assert trtpd(["rollout", str(good)]) == 0
        timeline["good"] = round(time.monotonic() - started, 2)
        after = pids("rs")
        assert after["prefill-0"] == before["prefill-0"] and "decode-0" not in after
        load.served(4)      # the promoted revision serves
        started = time.monotonic()
        assert trtpd(["rollout", "--undo", "rs"]) == 0
        timeline["undo"] = round(time.monotonic() - started, 2)
        load.served(4)      # the revision undone to serves
    print(f"trtllm-serve rollout timelines (s): {timeline}; {len(load.results)} requests, errors {load.errors}")
    assert load.errors == []
    assert [p for p, text in load.results if text != reference[p]] == []
    store = open_store("rs")
    assert [(r.number, r.status) for r in store.revisions()] == \
        [(1, "superseded"), (2, "rolled_back"), (3, "superseded"), (4, "promoted")]
    assert json.loads(json.dumps(store.revision(4).spec_json)) == store.revision(1).spec_json
    assert {i.protocol for i in load_fleet("rs").instances} == {"trtllm-serve"}


def _environ(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(i.decode().split("=", 1) for i in items if b"=" in i)


def test_a_trtllm_serve_deployment_on_a_gpu_inventory_scales_within_it(trtpd_home, fp16_root, tmp_path):
    """A spec with a `gpus` inventory: the controller starts the workers `trtpd build` rendered for the PyTorch
    backend (serve-pytorch/launch.sh; the command pointed at the CPU twin, which takes trtllm-serve's command line),
    each with CUDA_VISIBLE_DEVICES a set of its own. Under load decode scales 1 -> 2 onto the last free GPU, a third
    decode is refused naming the GPUs it needs, a SIGKILLed prefill is replaced on the GPU it held (at once: its
    GPU counts as free when its process is gone, or the replacement waits for the stop, rather than failing a first
    start), and no request fails."""
    import sys

    engines = tmp_path / "gpu-engines"
    assert trtpd(["build", "--model", "tiny-llama", "--configs-only", "--no-fp8", "--hf-model",
                  str(fp16_root / "checkpoint"), "--engines-dir", str(engines)]) == 0
    spec = tmp_path / "g.yaml"
    spec.write_text(f"""name: g
model: tiny-llama
backend: trtllm-serve
engines: {{build_root: {engines / 'tiny-llama'}}}
roles:
  prefill: {{instances: 1}}
  decode: {{instances: 1}}
gpus:
  devices: [0, 1, 2]
  serve_dir: {engines / 'tiny-llama' / 'deploy' / 'serve-pytorch'}
  serve_command: {sys.executable} -m trtpd.serve_twin
slo: {{ttft_s: 2.0, tpot_s: 0.1, attainment: 0.9}}
rollout: {{drain_timeout_s: 20}}
""")
    bring_up(spec, progress=lambda *_: None)
    try:
        fleet = load_fleet("g")
        model = fleet.instances[0].model
        c = client("g")

        def run(prompt: str) -> str:
            stream = c.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                          stream=True)
            return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        reference = {p: run(p) for p in PROMPTS[:4]}
        errors, results, stop = [], [], threading.Event()

        def load() -> None:
            n = 0
            while not stop.is_set():
                prompt = PROMPTS[n % 4]
                try:
                    results.append((prompt, run(prompt)))
                except Exception as exc:   # reported by the test
                    errors.append(f"{type(exc).__name__}: {exc}")
                n += 1
        worker = threading.Thread(target=load, daemon=True)
        worker.start()
        try:
            assert trtpd(["scale", "g", "decode=2", "--timeout-s", "120"]) == 0
            deadline = time.monotonic() + 10
            while counts("g")["decode"] != 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            served = len(results)
            while len(results) < served + 4 and time.monotonic() < deadline + 30:
                time.sleep(0.05)
            assert trtpd(["scale", "g", "decode=3", "--timeout-s", "30"]) != 0      # 4 GPUs for 3 devices
            # healed on a full inventory (prefill: its requests are prefilled again; a decode's stream would break)
            victim, killed_at, _ = kill_and_wait_replaced("g", "prefill")
            assert [e.detail for e in audit("g", "start_failed") if e.ts > killed_at] == []
        finally:
            stop.set()
            worker.join(60)
        sets = {i.name: _environ(i.server.pid)["CUDA_VISIBLE_DEVICES"] for i in load_fleet("g").instances}
        assert sorted(sets.values()) == ["0", "1", "2"], sets
        assert {i.name: list(i.gpus) for i in load_fleet("g").instances} == {n: [int(v)] for n, v in sets.items()}
        assert errors == [] and [p for p, text in results if text != reference[p]] == []
    finally:
        assert trtpd(["down", "--name", "g"]) == 0


def test_a_triton_world_is_replaced_by_a_bigger_world_under_streaming_load(deployment):
    """backend tensorrt-llm: a revision is one world (here its CPU stand-in, the single-server reference deployment:
    prefill and decode models in one tritonserver). `trtpd scale world prefill=2` starts a 2P1D world beside the
    1P1D one, moves traffic through the canary and gate, drains the old world and stops it only after its last
    stream ended; no request fails and every request's prefill and decode ran in one world."""
    from trtpd.controller.local import LocalExecutor

    # min_requests 3: a slower machine still gets them within 3 x bake_s while the new world's start slows the load;
    # ratios 20: a fresh world's first requests run on cold stubs (TTFT p90 138 ms against an idle stable world's
    # 31 ms once, which a 4x gate rolled back); the SLO still bounds them
    deployment("world", backend="tensorrt-llm", rollout="{canary_share: 0.5, bake_s: 5, min_requests: 3, "
                                                        "max_ttft_ratio: 20, max_tpot_ratio: 20, drain_timeout_s: 20}")
    fleet = load_fleet("world")
    assert [(i.name, i.role, i.world_roles) for i in fleet.instances] == [("world-0", "world", ["prefill", "decode"])]
    c = client("world")
    # longer streams than the other tests': one is mostly in flight when the old world is told to drain
    reference = {p: complete(c, p, LONG_TOKENS) for p in PROMPTS}
    started_s = time.time()
    with Load(c, threads=1, max_tokens=LONG_TOKENS) as load:    # one stream at a time: the new world starts sooner
        load.served(4)
        began = time.monotonic()
        assert trtpd(["scale", "world", "prefill=2", "--timeout-s", "180"]) == 0
        replaced_s = round(time.monotonic() - began, 2)
        load.served(4)      # the new world serves
    ready = wait_audit("world", lambda e: e.action == "ready" and e.detail["instance"] == "world-1", 1, "world-1")
    drained = wait_audit("world", lambda e: e.action == "drained", 1, "the old world drained")
    stopped = wait_audit("world", lambda e: e.action == "stop" and e.detail["instance"] == "world-0", 1, "its stop")
    print(f"world replacement: scale CLI {replaced_s} s (new world ready after {ready.detail['start_s']} s, old "
          f"world drained in {drained.detail['drain_s']} s); {len(load.results)} requests under load")
    assert load.errors == []
    assert [p for p, text in load.results if text != reference[p]] == []
    assert not audit("world", "drain_timeout") and drained.detail["instance"] == "world-0"
    assert [(i.name, i.revision) for i in load_fleet("world").instances] == [("world-1", 2)]
    samples = [s for s in LocalExecutor("world", "disaggregated").samples(started_s) if s.ok]
    worlds = {s.prefill_instance.split(".")[0] for s in samples}
    assert worlds == {"world-0", "world-1"}, worlds          # both served: the canary split, then the new world
    assert all(s.decode_instance.split(".")[0] == s.prefill_instance.split(".")[0] for s in samples)
    last_on_old = max(s.t for s in samples if s.decode_instance.startswith("world-0."))
    assert last_on_old <= stopped.ts, (last_on_old, stopped.ts)
