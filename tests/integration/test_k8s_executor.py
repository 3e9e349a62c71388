"""KubernetesExecutor through the official client against a fake API server over real HTTP (tests/fakes/kube_api.py):
scale out and in, a rollout from revision 1 to 2, force stop, and a restarted executor finding its instances.
No cluster: the fake's ReplicaSet acts at once and starts every pod Running and Ready (see its docstring)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.fakes.kube_api import FakeKubeApi
from trtpd.trtllm.plan import plan_build
from trtpd.trtllm.recipe import load_recipes
from trtpd.trtllm.spec import BuildOverrides, make_request
from trtpd.controller.k8s.executor import KubernetesExecutor, api_client
from trtpd.controller.k8s.gateway_admin import GatewayAdmin, admin_token
from trtpd.controller.k8s.manifests import EnginesVolume, K8sFleet
from trtpd.controller.types import RoleShape, TrafficSplit
from trtpd.gateway.config import from_fleet_file

KEY = bytes(range(32))
DECODE = "llama-decode-r1"


@pytest.fixture(scope="module")
def plan():
    return plan_build(make_request("llama-2-70b", load_recipes(), BuildOverrides(prefill_tp=2, decode_tp=4),
                                   engines_dir=Path("/engines")))


@pytest.fixture
def kube():
    fake = FakeKubeApi()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def admin_calls() -> list:
    return []


@pytest.fixture
def make_executor(kube, plan, admin_calls):
    fleet = K8sFleet("llama", "/engines/llama-2-70b/hf", EnginesVolume(pvc_name="trtpd-engines"), KEY, "trtpd:0.1")

    def make(**kw) -> KubernetesExecutor:
        kw.setdefault("router_admin", lambda name, state: admin_calls.append((name, state)))
        return KubernetesExecutor(api_client(kube.url), fleet, lambda revision: plan, **kw)
    return make


def decode_shape(plan, revision: int = 1) -> RoleShape:
    return RoleShape("decode", str(plan.decode.engine_dir), f"hash-r{revision}", "fp8/80/8/128/32",
                     gpus_per_instance=4, tp=4)


def bound(kube, deployment: str, *, terminating: bool = False) -> list[str]:
    pods = kube.pods(deployment, terminating=terminating)
    return [p["metadata"]["labels"].get("trtpd.dev/instance", "") for p in pods]


def replicas_patched(kube, deployment: str) -> list[int]:
    patches = kube.calls_to("PATCH", f"/deployments/{deployment}")
    return [c.body["spec"]["replicas"] for c in patches if "spec" in c.body]


def fleet_file(kube) -> dict:
    return json.loads(kube.get("configmaps", "llama-fleet")["data"]["fleet.json"])


def test_scale_decode_1_to_3_to_1_removes_the_drained_pods(kube, make_executor, plan, admin_calls):
    ex = make_executor()
    ex.start("decode-r1-0", "decode", 1, decode_shape(plan))
    assert [(o.name, o.alive, o.ready) for o in ex.observe()] == [("decode-r1-0", True, True)]
    ex.start("decode-r1-1", "decode", 1, decode_shape(plan))
    ex.start("decode-r1-2", "decode", 1, decode_shape(plan))
    assert sorted(o.name for o in ex.observe()) == ["decode-r1-0", "decode-r1-1", "decode-r1-2"]
    assert bound(kube, DECODE) == ["decode-r1-0", "decode-r1-1", "decode-r1-2"]      # oldest pod, first name

    ex.drain("decode-r1-1")
    assert admin_calls == [("decode-r1-1", "draining")]
    assert {i["name"]: i["admin_state"] for i in fleet_file(kube)["instances"]}["decode-r1-1"] == "draining"
    before = len(kube.calls)
    ex.stop("decode-r1-1")
    patches = [c for c in kube.calls[before:] if c.method == "PATCH"]
    assert "/pods/" in patches[0].path
    assert patches[0].body["metadata"]["annotations"] == {"controller.kubernetes.io/pod-deletion-cost": "-1000"}
    assert patches[1].path.endswith(f"/deployments/{DECODE}") and patches[1].body["spec"] == {"replicas": 2}
    assert bound(kube, DECODE) == ["decode-r1-0", "decode-r1-2"]                     # the drained one went
    assert sorted(o.name for o in ex.observe()) == ["decode-r1-0", "decode-r1-2"]
    kube.reap()

    ex.drain("decode-r1-2")
    ex.stop("decode-r1-2")
    kube.reap()
    assert bound(kube, DECODE, terminating=True) == ["decode-r1-0"]
    assert [o.name for o in ex.observe()] == ["decode-r1-0"]
    assert replicas_patched(kube, DECODE) == [2, 3, 2, 1]
    assert kube.get("deployments", DECODE) is not None           # the stable revision stays
    assert [i["name"] for i in fleet_file(kube)["instances"]] == ["decode-r1-0"]
    assert not kube.calls_to("DELETE", "/pods/")                 # the ReplicaSet removed them, gracefully
    assert {c.content_type for c in kube.calls_to("PATCH")} == {"application/merge-patch+json"}


def test_rollout_moves_replicas_to_revision_2_and_deletes_revision_1(kube, make_executor, plan):
    ex = make_executor()
    for n in range(2):
        ex.start(f"decode-r1-{n}", "decode", 1, decode_shape(plan))
    ex.observe()

    ex.start("decode-r2-0", "decode", 2, decode_shape(plan, 2))
    created = kube.calls_to("POST", "/deployments")[-1].body
    assert created["metadata"]["name"] == "llama-decode-r2" and created["spec"]["replicas"] == 1
    ex.observe()
    ex.set_traffic(TrafficSplit(stable_revision=1, canary_revision=2, canary_share=0.25, changed_roles=("decode",)))
    traffic = fleet_file(kube)["traffic"]
    assert traffic == {"stable_revision": 1, "canary_revision": 2, "canary_share": 0.25,
                       "changed_roles": ["decode"], "canary_instances": ["decode-r2-0"]}

    # what a rollout controller does, one step at a time: drain and stop an old one, start a new one
    for step, (old, new) in enumerate([("decode-r1-0", "decode-r2-1"), ("decode-r1-1", None)]):
        ex.drain(old)
        ex.stop(old)
        kube.reap()
        if new:
            ex.start(new, "decode", 2, decode_shape(plan, 2))
        observed = {o.name: o.revision for o in ex.observe()}
        assert sum(r == 1 for r in observed.values()) == 1 - step
    assert replicas_patched(kube, "llama-decode-r1") == [2, 1, 0]
    assert replicas_patched(kube, "llama-decode-r2") == [2]
    assert kube.get("deployments", "llama-decode-r1") is not None   # still the stable revision until promoted

    ex.set_traffic(TrafficSplit(stable_revision=2))
    assert kube.get("deployments", "llama-decode-r1") is None
    assert kube.get("configmaps", "llama-decode-r1-serve") is None
    assert bound(kube, "llama-decode-r2") == ["decode-r2-0", "decode-r2-1"]
    fleet = fleet_file(kube)
    assert fleet["traffic"]["stable_revision"] == 2 and fleet["traffic"]["canary_revision"] == 0
    assert [(i["name"], i["revision"]) for i in fleet["instances"]] == [("decode-r2-0", 2), ("decode-r2-1", 2)]


def test_force_stop_deletes_the_pod_at_once(kube, make_executor, plan):
    ex = make_executor()
    ex.start("decode-r1-0", "decode", 1, decode_shape(plan))
    ex.start("decode-r1-1", "decode", 1, decode_shape(plan))
    ex.observe()
    pod = kube.pods(DECODE)[0]["metadata"]["name"]
    ex.stop("decode-r1-0", force=True)
    (delete,) = kube.calls_to("DELETE", f"/pods/{pod}")
    assert delete.query.get("gracePeriodSeconds") == "0"
    assert bound(kube, DECODE, terminating=True) == ["decode-r1-1"]      # gone, not terminating
    assert [o.name for o in ex.observe()] == ["decode-r1-1"]


def test_a_restarted_executor_binds_what_the_first_one_started(kube, make_executor, plan):
    first = make_executor()
    first.start("decode-r1-0", "decode", 1, decode_shape(plan))
    first.start("decode-r1-1", "decode", 1, decode_shape(plan))
    first.start("decode-r1-1", "decode", 1, decode_shape(plan))          # a retried start changes nothing
    assert kube.get("deployments", DECODE)["spec"]["replicas"] == 2
    again = make_executor(holds_source=lambda name: {"decode-r1-0": 3}.get(name, 0))
    assert sorted((o.name, o.holds) for o in again.observe()) == [("decode-r1-0", 3), ("decode-r1-1", 0)]


def test_a_pending_pod_is_starting_and_a_crash_looping_one_is_not_alive(kube, make_executor, plan):
    ex = make_executor()
    ex.start("decode-r1-0", "decode", 1, decode_shape(plan))
    pod = kube.pods(DECODE)[0]["metadata"]["name"]
    kube.set_pod_status(pod, "Pending", ready=False)
    (seen,) = ex.observe()   # scheduling / pulling: the controller's "starting" (its start timeout bounds it)
    assert (seen.name, seen.alive, seen.ready, seen.holds) == ("decode-r1-0", True, False, 0)
    assert "Pending" in seen.reason
    kube.set_pod_status(pod, "Running", ready=False)
    kube.objects[("pods", "default", pod)]["status"]["containerStatuses"] = [
        {"name": "trtllm-serve", "ready": False, "restartCount": 3, "image": "x", "imageID": "x",
         "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]
    (seen,) = ex.observe()
    assert (seen.alive, seen.ready) == (False, False) and "CrashLoopBackOff" in seen.reason


def test_the_fleet_file_is_one_the_gateway_reads(kube, make_executor, plan, tmp_path):
    ex = make_executor()
    ex.start("decode-r1-0", "decode", 1, decode_shape(plan))
    ex.observe()
    fleet = fleet_file(kube)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2, "trtpd": {"model": "llama-2-70b"}}))
    (tmp_path / "fleet.json").write_text(json.dumps({**fleet, "tokenizer_dir": str(tmp_path)}))
    config = from_fleet_file(tmp_path / "fleet.json")
    pod_ip = kube.pods(DECODE)[0]["status"]["podIP"]
    # the pod runs trtllm-serve: the gateway reaches it over its OpenAI HTTP (trtllm_http.py), not Triton gRPC
    assert [(i.name, i.role, i.protocol, i.http_url) for i in config.instances] == \
        [("decode-r1-0", "decode", "trtllm-serve", f"{pod_ip}:8000")]
    assert config.key_file == Path("/etc/trtpd/kv/key")


def test_gateway_admin_sends_the_admin_token():
    seen = []

    class Gateway(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            seen.append((self.command, self.path, self.headers["authorization"], body))
            data = json.dumps({"instances": [{"name": "decode-r1-0", "waiting": 2, "active": 5}]}).encode()
            self.send_response(404 if self.path.endswith("/unknown") else 200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        gateway = GatewayAdmin(f"http://127.0.0.1:{server.server_address[1]}", admin_token(KEY))
        gateway.set_state("decode-r1-0", "draining")
        gateway.set_state("unknown", "draining")                   # not in the gateway's fleet: nothing to drain
        gateway.reload()
        assert gateway.holds("decode-r1-0") == 7 and gateway.holds("decode-r1-9") == -1
    finally:
        server.shutdown()
        server.server_close()
    token = "Bearer " + admin_token(KEY)
    assert seen[0] == ("PUT", "/admin/instances/decode-r1-0", token, b'{"state": "draining"}')
    assert [s[:2] for s in seen[2:]] == [("POST", "/admin/reload"), ("GET", "/health"), ("GET", "/health")]
    assert all(s[2] == token for s in seen)


def test_it_has_the_executor_protocols_methods():
    import inspect

    from trtpd.controller.types import Executor

    for name in ("observe", "start", "drain", "stop", "set_traffic"):
        ours, theirs = inspect.signature(getattr(KubernetesExecutor, name)), inspect.signature(getattr(Executor, name))
        assert list(ours.parameters) == list(theirs.parameters), name
        assert [p.default for p in ours.parameters.values()] == [p.default for p in theirs.parameters.values()], name


def test_in_place_routing_goes_into_the_gateways_fleet_file(kube, make_executor, plan):
    ex = make_executor()
    ex.start("decode-r1-0", "decode", 1, decode_shape(plan))
    ex.observe()
    assert fleet_file(kube)["routing"] is None
    ex.apply_in_place({"routing": {"balance": "round_robin", "max_prefill_attempts": 3}})
    assert fleet_file(kube)["routing"] == {"balance": "round_robin", "max_prefill_attempts": 3}
