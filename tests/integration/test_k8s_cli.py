"""`trtpd up -f` with a `kubernetes:` section, then `status`, `scale`, `rollout`, `history`, `down`, through the CLI's
main() in process (the controller process itself runs apart, under supervisord, as `trtpd up` starts it), against
a fake API server over real HTTP (tests/fakes/kube_api.py) reached through the official `kubernetes` client, and a
fake gateway (a small HTTP server on 127.0.0.1 that lists the instances of the fleet file the executor writes,
with the holds the test sets).

What this covers: the spec's kubernetes section selects the Kubernetes executor in `trtpd up` and in the controller
process; the objects applied (validated against Kubernetes 1.30's schema), replicas moved by scale and rollout,
a pod removed only after its drain (deregistered at the gateway, holds 0), a pod deleted by someone else
replaced, and every object deleted by `down` with the controller process stopped.

What it cannot cover: a real cluster. The fake's ReplicaSet acts at once inside the API call and starts every pod
Running and Ready (no scheduler, no image pull, no probes, no Pending pods for want of a GPU); it has no
ReplicaSet objects, watches, garbage collector (a deleted Deployment takes its pods at once), admission, RBAC or
field validation; the kubelet's ConfigMap sync delay and the preStop pause do not happen; the gateway is a fake
that counts nothing itself.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_k8s_executor import kube  # noqa: F401 (the fake API server fixture)
from tests.unit.controller.test_k8s_spec import finished_engines
from trtpd.cli.main import main
from trtpd.controller.k8s.manifests import validate_manifests
from trtpd.controller.store import ControllerStore
from trtpd.process_identity import is_running

NAME = "llama"
FLEET_CM = f"{NAME}-fleet"


class FakeGateway:
    """GET /health lists the instances of the fleet file in the fake API server (what the real gateway reads),
    each with `gateway_holds` from `holds`; PUT /admin/instances/NAME is recorded with its arrival time."""

    def __init__(self, kube: FakeKubeApi) -> None:
        self.kube, self.holds, self.puts = kube, {}, []
        self.health_reads = 0          # /health answers, each a controller pass reading the holds
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.startswith("/admin/requests"):
                    return self._answer(200, {"requests": []})
                gateway.health_reads += 1
                self._answer(200, {"instances": [{"name": n, "waiting": 0, "active": 0,
                                                  "gateway_holds": gateway.holds.get(n, 0)}
                                                 for n in gateway.instances()]})

            def do_PUT(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                gateway.puts.append((self.path.rsplit("/", 1)[1], body["state"], time.monotonic()))
                self._answer(200, {})

            def do_POST(self) -> None:
                self._answer(200, {})

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def instances(self) -> list[str]:
        cm = self.kube.get("configmaps", FLEET_CM)
        return [i["name"] for i in json.loads(cm["data"]["fleet.json"])["instances"]] if cm else []

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway(kube):
    fake = FakeGateway(kube)
    yield fake
    fake.stop()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """TRTPD_HOME in tmp; at the end the controller process and its supervisord are stopped by pid."""
    monkeypatch.setenv("TRTPD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")           # status's tables unwrapped
    yield tmp_path / "home"
    db = tmp_path / "home" / "deployments" / NAME / "controller.db"
    if db.is_file():
        from trtpd.controller.daemon import stop_controller
        from trtpd.fleet.supervisor import stop_supervisor
        stop_supervisor(ControllerStore(db).get("supervisor"), 20)
        stop_controller(NAME)


@pytest.fixture
def spec_file(tmp_path, kube, gateway) -> Path:
    """llama-2-70b engines as `trtpd build` leaves them (manifests complete; no weights: no pod reads them here),
    prefill TP2 and decode TP4, in the folder that is the pods' engines mount."""
    mount = tmp_path / "engines"
    finished_engines(mount)
    spec = {"name": NAME, "model": "llama-2-70b", "backend": "trtllm-serve", "kv_transport": "ucx",
            "engines": {"build_root": str(mount / "llama-2-70b")},
            "roles": {"prefill": {"instances": 1, "tp": 2}, "decode": {"instances": 1, "tp": 4}},
            "rollout": {"bake_s": 0, "min_requests": 0, "drain_timeout_s": 60},
            "kubernetes": {"api_server": kube.url, "gateway_image": "registry.example/trtpd:test",
                           "engines": {"mount_path": str(mount), "pvc_name": "trtpd-engines"},
                           "gateway_url": gateway.url}}
    path = tmp_path / "llama.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def trtpd(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def replicas(kube, deployment: str) -> int | None:
    dep = kube.get("deployments", deployment)
    return None if dep is None else dep["spec"]["replicas"]


def pods_of(kube, deployment: str) -> dict[str, str]:
    """instance name -> pod name, for the pods not terminating."""
    return {p["metadata"]["labels"].get("trtpd.dev/instance", ""): p["metadata"]["name"]
            for p in kube.pods(deployment)}


def wait_for(predicate, timeout_s: float = 30.0, what: str = ""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def store() -> ControllerStore:
    return ControllerStore(Path(os.environ["TRTPD_HOME"]) / "deployments" / NAME / "controller.db")


def actions(kind: str) -> list[dict]:
    return [e.detail for e in store().audit_log() if e.action == kind]


def test_up_status_scale_with_drain_then_down(kube, gateway, home, spec_file, capsys):
    code, out = trtpd(capsys, "up", "-f", str(spec_file))
    assert code == 0, out
    assert f"OpenAI API   {gateway.url}/v1" in out and "llama-api-key" in out
    created = [c.body for c in kube.calls_to("POST")]     # shared objects: created once, then found (409)
    assert validate_manifests(created, "1.30") == []
    assert sorted({(m["kind"], m["metadata"]["name"]) for m in created}) == sorted([
        ("Secret", "llama-kv-key"), ("Secret", "llama-api-key"), ("ConfigMap", "llama-fleet"),
        ("ConfigMap", "llama-prefill-r1-serve"), ("Deployment", "llama-prefill-r1"), ("Service", "llama-prefill"),
        ("ConfigMap", "llama-decode-r1-serve"), ("Deployment", "llama-decode-r1"), ("Service", "llama-decode"),
        ("Deployment", "llama-gateway"), ("Service", "llama-gateway"), ("NetworkPolicy", "llama-instances")])
    decode_pod = kube.get("deployments", "llama-decode-r1")["spec"]["template"]["spec"]["containers"][0]
    assert decode_pod["resources"]["limits"]["nvidia.com/gpu"] == "4"                  # TP4 from the engine
    assert pods_of(kube, "llama-prefill-r1").keys() == {"prefill-0"}
    assert pods_of(kube, "llama-decode-r1").keys() == {"decode-0"}
    controller = store().get("controller")
    assert is_running(int(controller["pid"]), controller["start_time"]) and controller["pid"] != os.getpid()
    assert not (home / "deployments" / NAME / "fleet.json").exists()     # no local fleet, no local gateway

    code, out = trtpd(capsys, "status", "--name", NAME, "--json")
    (view,) = json.loads(out)
    assert (view["kind"], view["namespace"], view["gateway_ready_replicas"]) == ("kubernetes", "default", 1)
    assert {(i["name"], i["state"], i["pod"]) for i in view["instances"]} == {
        ("prefill-0", "ready", pods_of(kube, "llama-prefill-r1")["prefill-0"]),
        ("decode-0", "ready", pods_of(kube, "llama-decode-r1")["decode-0"])}
    assert view["controller"]["running"] and view["controller"]["counts"] == {"prefill": 1, "decode": 1}

    code, out = trtpd(capsys, "scale", NAME, "decode=2", "--timeout-s", "60")
    assert code == 0, out
    assert replicas(kube, "llama-decode-r1") == 2
    assert pods_of(kube, "llama-decode-r1").keys() == {"decode-0", "decode-1"}

    # scale in while both hold requests: the newest is drained, and its pod stays until what it holds is done
    gateway.holds.update({"decode-0": 3, "decode-1": 3})   # equal holds: the newest goes
    victim_pod = pods_of(kube, "llama-decode-r1")["decode-1"]
    code, out = trtpd(capsys, "scale", NAME, "decode=1", "--no-wait")
    assert code == 0, out
    put = wait_for(lambda: [p for p in gateway.puts if p[:2] == ("decode-1", "draining")], 20, "the drain")[0]
    seen = gateway.health_reads      # the controller reads the holds (> 0) on 4 more passes: > quiet_s (1 s) of them
    wait_for(lambda: gateway.health_reads >= seen + 4 and time.monotonic() - put[2] > 1.5, 20, "passes seeing holds")
    assert replicas(kube, "llama-decode-r1") == 2 and victim_pod in pods_of(kube, "llama-decode-r1").values()
    assert not [c for c in kube.calls_to("PATCH", f"/pods/{victim_pod}") if "annotations" in c.body["metadata"]]
    holds_zero_s = time.monotonic()
    gateway.holds["decode-1"] = 0
    wait_for(lambda: replicas(kube, "llama-decode-r1") == 1, 20, "replicas 1")
    assert pods_of(kube, "llama-decode-r1").keys() == {"decode-0"}
    terminating = kube.pods("llama-decode-r1", terminating=True)
    assert victim_pod in {p["metadata"]["name"] for p in terminating if "deletionTimestamp" in p["metadata"]}

    # the sequence: fleet file says draining, the gateway is told, holds reach 0, the pod is picked, replicas -1
    drained_cm = [c for c in kube.calls_to("PATCH", f"/configmaps/{FLEET_CM}")
                  if any(i["name"] == "decode-1" and i["admin_state"] == "draining"
                         for i in json.loads(c.body["data"]["fleet.json"])["instances"])]
    (cost,) = [c for c in kube.calls_to("PATCH", f"/pods/{victim_pod}") if "annotations" in c.body["metadata"]]
    assert cost.body["metadata"]["annotations"] == {"controller.kubernetes.io/pod-deletion-cost": "-1000"}
    (down_to_1,) = [c for c in kube.calls_to("PATCH", "/deployments/llama-decode-r1")
                    if c.body.get("spec", {}).get("replicas") == 1]
    assert drained_cm[0].at_s <= put[2] < holds_zero_s < cost.at_s < down_to_1.at_s
    assert not kube.calls_to("DELETE", "/pods/")          # removed by its ReplicaSet, through its grace period
    assert [d["instance"] for d in actions("drained")] == ["decode-1"] and not actions("drain_timeout")

    pid = int(store().get("controller")["pid"])
    code, out = trtpd(capsys, "down", "--name", NAME)
    assert code == 0, out
    assert f"stopped the controller of {NAME} (pid {pid})" in out
    assert not is_running(pid, store().get("controller")["start_time"])
    assert [k for k in kube.objects if k[0] != "pods"] == []
    assert all("deletionTimestamp" in p["metadata"] for p in kube.objects.values())
    assert [r for r in store().instances() if r.state != "stopped"] == []
    code, out = trtpd(capsys, "status", "--name", NAME, "--json")
    assert json.loads(out)[0]["instances"] == []


def test_heal_rollout_history(kube, gateway, home, spec_file, tmp_path, capsys):
    from kubernetes import client

    from trtpd.controller.k8s.executor import api_client

    assert trtpd(capsys, "up", "-f", str(spec_file))[0] == 0
    # someone deletes the decode pod: its ReplicaSet makes another, which the controller's replacement takes
    pod = pods_of(kube, "llama-decode-r1")["decode-0"]
    client.CoreV1Api(api_client(kube.url)).delete_namespaced_pod(pod, "default", grace_period_seconds=0)
    wait_for(lambda: store().instance("decode-1") and store().instance("decode-1").state == "ready", 20,
             "the replacement")
    assert store().instance("decode-0").state == "stopped"
    assert replicas(kube, "llama-decode-r1") == 1 and pods_of(kube, "llama-decode-r1").keys() == {"decode-1"}

    # a new decode config: a canary Deployment r2, promoted (bake 0, no requests needed), r1's deleted
    new = yaml.safe_load(spec_file.read_text())
    new["roles"]["decode"]["max_batch_size"] = 32
    (tmp_path / "llama-r2.yaml").write_text(yaml.safe_dump(new))
    code, out = trtpd(capsys, "rollout", str(tmp_path / "llama-r2.yaml"), "--timeout-s", "60")
    assert code == 0, out
    assert "revision 2: promoted" in out
    wait_for(lambda: kube.get("deployments", "llama-decode-r1") is None, 10, "r1 retired")
    assert replicas(kube, "llama-decode-r2") == 1 and replicas(kube, "llama-prefill-r1") == 1
    fleet = json.loads(kube.get("configmaps", FLEET_CM)["data"]["fleet.json"])
    assert fleet["traffic"]["stable_revision"] == 2
    code, out = trtpd(capsys, "status", "--name", NAME)
    decode_pod = next(iter(pods_of(kube, "llama-decode-r2").values()))
    assert code == 0 and "on Kubernetes, namespace default" in out and decode_pod in out
    assert f"{NAME}: controller pid" in out and "revision 2" in out

    # a kubernetes section cannot change in a rollout
    moved = {**new, "kubernetes": {**new["kubernetes"], "namespace": "other"}}
    (tmp_path / "llama-moved.yaml").write_text(yaml.safe_dump(moved))
    code, out = trtpd(capsys, "rollout", str(tmp_path / "llama-moved.yaml"), "--timeout-s", "10")
    assert code == 2 and "kubernetes section differs" in out

    code, out = trtpd(capsys, "history", NAME)
    assert code == 0
    for action in ("up", "failed", "rollout_started", "rollout_finished", "rollout_refused", "controller_started"):
        assert f" {action} " in out, action
    assert trtpd(capsys, "down", "--name", NAME)[0] == 0
    assert [k for k in kube.objects if k[0] != "pods"] == []


def test_up_refuses_leftover_objects_and_bad_engines(kube, gateway, home, spec_file, capsys):
    kube.objects[("configmaps", "default", FLEET_CM)] = {"metadata": {
        "name": FLEET_CM, "namespace": "default", "resourceVersion": "1",
        "labels": {"app.kubernetes.io/name": "trtpd", "app.kubernetes.io/instance": NAME}}}
    code, out = trtpd(capsys, "up", "-f", str(spec_file))
    assert code == 2 and "ConfigMap llama-fleet" in out and "trtpd down --name llama" in out
    assert not kube.calls_to("POST")
    del kube.objects[("configmaps", "default", FLEET_CM)]
    shutil.rmtree(spec_file.parent / "engines" / "llama-2-70b" / "decode-tp4")
    code, out = trtpd(capsys, "up", "-f", str(spec_file))
    assert code == 2 and "decode-tp4" in out and not kube.calls_to("POST")
