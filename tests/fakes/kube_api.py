"""A fake Kubernetes API server for tests: just what trtpd's KubernetesExecutor calls, over real HTTP.

Threaded HTTP on 127.0.0.1 (a free port). Objects: apps/v1 deployments, core/v1 pods, configmaps, secrets,
services, networking.k8s.io/v1 networkpolicies: create (409 if present), get, list (labelSelector with
`k=v`, `k!=v`, `k`, `!k`), PATCH as merge-patch or strategic-merge-patch (treated as a merge patch: enough for
the maps and scalars patched here; 415 for any other patch type, e.g. a JSON patch), delete.

A minimal ReplicaSet controller runs synchronously inside every request that changes a deployment's replicas
or deletes a pod: missing pods are created Running and Ready at once; excess pods are marked terminating
(deletionTimestamp), not-ready ones first, then the lowest `controller.kubernetes.io/pod-deletion-cost`, then the
newest, as the real one ranks them. A terminating pod stays listed until `reap()` (the kubelet finishing its
grace period) or a DELETE with gracePeriodSeconds=0. Deleting a deployment terminates its pods.

Not modelled: scheduling, images, probes, ReplicaSet objects, watches, resourceVersion beyond a counter (a
patch carrying metadata.resourceVersion must match it, else 409), field validation, RBAC.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MERGE_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
KINDS = {"deployments": "Deployment", "pods": "Pod", "configmaps": "ConfigMap", "secrets": "Secret",
         "services": "Service", "networkpolicies": "NetworkPolicy"}
PREFIXES = {"/apis/apps/v1/": "apps/v1", "/api/v1/": "v1", "/apis/networking.k8s.io/v1/": "networking.k8s.io/v1"}


@dataclass
class Call:
    method: str
    path: str
    query: dict
    content_type: str
    body: object
    at_s: float = field(default_factory=time.monotonic)   # when it arrived (orders calls across fakes)


@dataclass
class FakeKubeApi:
    objects: dict = field(default_factory=dict)      # (plural, namespace, name) -> object
    calls: list[Call] = field(default_factory=list)
    url: str = ""
    _version: int = 0
    _pod_seq: int = 0
    _owner: dict = field(default_factory=dict)      # pod name -> deployment name (what ownerReferences say)
    _seq: dict = field(default_factory=dict)        # pod name -> creation order
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, body = fake.handle(self.command, self.path, self.headers.get("content-type", ""), raw)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # ---- what tests look at -----------------------------------------------------------------------
    def get(self, plural: str, name: str, namespace: str = "default") -> dict | None:
        return self.objects.get((plural, namespace, name))

    def pods(self, deployment: str, namespace: str = "default", *, terminating: bool = False) -> list[dict]:
        return [p for p in self._owned(deployment, namespace)
                if terminating or "deletionTimestamp" not in p["metadata"]]

    def calls_to(self, method: str, fragment: str = "") -> list[Call]:
        return [c for c in self.calls if c.method == method and fragment in c.path]

    def reap(self) -> None:
        """Every terminating pod finishes its grace period and goes; its ReplicaSet does not replace it."""
        with self._lock:
            for key in [k for k, o in self.objects.items() if k[0] == "pods" and "deletionTimestamp" in o["metadata"]]:
                del self.objects[key]

    def set_pod_status(self, name: str, phase: str, ready: bool, namespace: str = "default") -> None:
        pod = self.objects[("pods", namespace, name)]
        pod["status"]["phase"] = phase
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]

    # ---- the API ----------------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, content_type: str, raw: bytes) -> tuple[int, dict]:
        url = urlparse(raw_path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = json.loads(raw) if raw else None
        with self._lock:
            self.calls.append(Call(method, url.path, query, content_type.split(";")[0], body))
            route = self._route(url.path)
            if route is None:
                return _status(404, "NotFound", f"the fake API server has no route {url.path}")
            api_version, plural, namespace, name = route
            if method == "POST" and name is None:
                return self._create(api_version, plural, namespace, body)
            if method == "GET" and name is None:
                return self._list(api_version, plural, namespace, query.get("labelSelector", ""))
            key = (plural, namespace, name)
            if key not in self.objects:
                return _status(404, "NotFound", f'{plural} "{name}" not found')
            if method == "GET":
                return 200, self.objects[key]
            if method == "PATCH":
                return self._patch(key, content_type.split(";")[0], body)
            if method == "DELETE":
                return self._delete(key, int(query.get("gracePeriodSeconds", (body or {}).get("gracePeriodSeconds",
                                                                                              -1))))
            return _status(405, "MethodNotAllowed", f"{method} is not served by the fake")

    def _route(self, path: str):
        for prefix, api_version in PREFIXES.items():
            if path.startswith(prefix):
                parts = path[len(prefix):].split("/")
                if len(parts) in (3, 4) and parts[0] == "namespaces" and parts[2] in KINDS:
                    return api_version, parts[2], parts[1], parts[3] if len(parts) == 4 else None
        return None

    def _bump(self, obj: dict) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)

    def _create(self, api_version: str, plural: str, namespace: str, body: dict) -> tuple[int, dict]:
        name = body["metadata"]["name"]
        if (plural, namespace, name) in self.objects:
            return _status(409, "AlreadyExists", f'{plural} "{name}" already exists')
        obj = json.loads(json.dumps(body))
        obj.update(apiVersion=api_version, kind=KINDS[plural])
        obj["metadata"].update(namespace=namespace, uid=f"uid-{self._version + 1}",
                               creationTimestamp=_timestamp(self._version))
        self._bump(obj)
        self.objects[(plural, namespace, name)] = obj
        if plural == "deployments":
            self._reconcile(obj)
        return 201, obj

    def _list(self, api_version: str, plural: str, namespace: str, selector: str) -> tuple[int, dict]:
        items = [o for (p, ns, _), o in sorted(self.objects.items()) if p == plural and ns == namespace
                 and _matches(o["metadata"].get("labels") or {}, selector)]
        return 200, {"apiVersion": api_version, "kind": KINDS[plural] + "List",
                     "metadata": {"resourceVersion": str(self._version)}, "items": items}

    def _patch(self, key: tuple, content_type: str, patch: dict) -> tuple[int, dict]:
        if content_type not in MERGE_TYPES or not isinstance(patch, dict):
            return _status(415, "UnsupportedMediaType", f"the fake takes only {' or '.join(MERGE_TYPES)} with an "
                                                        f"object body, got {content_type}")
        obj = self.objects[key]
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", f"the object has been modified (resourceVersion {wanted} is stale)")
        old_replicas = obj.get("spec", {}).get("replicas")
        _merge(obj, patch)
        self._bump(obj)
        if key[0] == "deployments" and obj["spec"].get("replicas") != old_replicas:
            self._reconcile(obj)
        return 200, obj

    def _delete(self, key: tuple, grace_s: int) -> tuple[int, dict]:
        plural, namespace, name = key
        obj = self.objects[key]
        if plural == "pods":
            if grace_s == 0:
                del self.objects[key]
            else:
                self._terminate(obj)
            owner = self._owner.get(name)
            if owner and ("deployments", namespace, owner) in self.objects:
                self._reconcile(self.objects[("deployments", namespace, owner)])
            return 200, obj
        del self.objects[key]
        if plural == "deployments":
            for pod in self._owned(name, namespace):
                self._terminate(pod)
        if plural == "services":   # the deleted object, as the API's OpenAPI spec has it (200: v1.Service)
            return 200, obj
        return 200, {"apiVersion": "v1", "kind": "Status", "status": "Success", "metadata": {}}

    # ---- the ReplicaSet controller, minimally ---------------------------------------------------------
    def _owned(self, deployment: str, namespace: str) -> list[dict]:
        return [o for (p, ns, _), o in sorted(self.objects.items()) if p == "pods" and ns == namespace
                and self._owner.get(o["metadata"]["name"]) == deployment]

    def _terminate(self, pod: dict) -> None:
        pod["metadata"].setdefault("deletionTimestamp", _timestamp(self._version))
        self._bump(pod)

    def _reconcile(self, deployment: dict) -> None:
        name, namespace = deployment["metadata"]["name"], deployment["metadata"]["namespace"]
        active = [p for p in self._owned(name, namespace) if "deletionTimestamp" not in p["metadata"]]
        want = deployment["spec"].get("replicas", 1)
        for _ in range(want - len(active)):
            self._new_pod(deployment)
        ranked = sorted(active, key=lambda p: (_is_ready(p), _cost(p), -self._seq[p["metadata"]["name"]]))
        for pod in ranked[:max(0, len(active) - want)]:
            self._terminate(pod)
        deployment["status"] = {"replicas": want, "readyReplicas": want}

    def _new_pod(self, deployment: dict) -> None:
        self._pod_seq += 1
        template = json.loads(json.dumps(deployment["spec"]["template"]))
        name = f"{deployment['metadata']['name']}-5d8f7-{self._pod_seq:05d}"
        meta = template.get("metadata", {})
        labels = {**meta.get("labels", {}), "pod-template-hash": "5d8f7"}
        self._owner[name], self._seq[name] = deployment["metadata"]["name"], self._pod_seq
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": deployment["metadata"]["namespace"], "labels": labels,
                            "annotations": meta.get("annotations", {}), "uid": f"pod-{self._pod_seq}",
                            "creationTimestamp": _timestamp(self._pod_seq)},
               "spec": template["spec"],
               "status": {"phase": "Running", "podIP": f"10.0.0.{self._pod_seq}",
                          "conditions": [{"type": "Ready", "status": "True"}]}}
        self._bump(pod)
        self.objects[("pods", pod["metadata"]["namespace"], name)] = pod


def _status(code: int, reason: str, message: str) -> tuple[int, dict]:
    return code, {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "reason": reason,
                  "message": message, "code": code}


def _timestamp(n: int) -> str:
    return f"2026-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}Z"


def _merge(target: dict, patch: dict) -> None:
    """RFC 7386: maps merge, null deletes, anything else replaces."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = json.loads(json.dumps(v))


def _matches(labels: dict, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            ok = labels.get(k) != v
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            ok = labels.get(k) == v
        elif term.startswith("!"):
            ok = term[1:] not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def _is_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def _cost(pod: dict) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(DELETION_COST, "0"))
