"""KubernetesExecutor: the controller's Executor protocol (trtpd/controller/types.py) over the Kubernetes API.

Instances are pods of their revision's Deployment `<name>-<role>-r<revision>` (manifests.py). The controller
names instances itself ("decode-r2-3") but a Deployment names its pods (`<deployment>-<hash>-<random>`), so the
executor binds the two, in the cluster, where a restarted executor finds them again:
  start()   raises spec.replicas by one and, in the same patch, appends the name to the Deployment's
            `trtpd.dev/pending-instances` annotation (a JSON list); when a pod went without stop() (deleted,
            evicted, node lost), its ReplicaSet has already made an unbound replacement, so the replacement
            instance takes that replica (replicas unchanged) instead of adding one;
  observe() labels each new, unbound pod `trtpd.dev/instance=<name>` (oldest pod takes the first pending name)
            and takes the name off the annotation.
  drain()   marks the pod `trtpd.dev/state=draining` and writes it `draining` into the gateway's fleet file, then
            tells the gateway at once (PUT /admin/instances/NAME): no new request goes there. The controller then
            waits for its holds (GatewayHolds: the gateway's count, which for prefill lasts until decode's pull
            of the KV is acknowledged) to be 0, or for rollout.drain_timeout_s, before it calls stop().
  stop()    annotates the pod `controller.kubernetes.io/pod-deletion-cost: "-1000"` and labels it
            `trtpd.dev/state=stopped`, then lowers spec.replicas by one, so the ReplicaSet removes that pod; with
            force it also deletes the pod with gracePeriodSeconds=0. A Deployment left at 0 replicas whose
            revision is neither the stable nor the canary one is deleted (with its serve ConfigMap).
Every read-modify-write of a Deployment carries its resourceVersion, so a concurrent writer makes it retry.

What a real cluster does that the test's fake API server does not: the ReplicaSet controller acts
asynchronously (pods appear and go after start()/stop() return; observe() binds them when they do); the
scheduler may leave a pod Pending (no free GPU), the kubelet pulls the image and runs the probes, so a pod is
Running long before it is Ready (engine load); the real ReplicaSet removes not-ready pods before ready ones
whatever their deletion cost, so a stop() while another instance of the same revision is still starting may
remove the starting pod instead (observe() then reports the stopped one still alive, and the controller
stops it again). Eviction and node loss terminate pods the executor did not stop: observe() shows them.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from trtpd.trtllm.plan import BuildPlan
from trtpd.controller.k8s.fleet_file import fleet_document, fleet_instance
from trtpd.controller.k8s.gateway_admin import GatewayAdmin, admin_token
from trtpd.controller.k8s.manifests import (DELETION_COST, LABEL_INSTANCE, LABEL_REVISION, LABEL_ROLE, LABEL_STATE,
                                            PENDING_ANNOTATION, K8sFleet, deployment_name, fleet_configmap,
                                            fleet_configmap_name, fleet_manifests, role_plan,
                                            serve_config_name)
from trtpd.controller.types import ObservedInstance, RoleShape, TrafficSplit
from trtpd.errors import TrtpdError

MERGE_PATCH = "application/merge-patch+json"   # RFC 7386, named on every patch (the client would pick strategic)
STOP_COST = "-1000"
RETRIES = 3


class KubernetesApiError(TrtpdError):
    def __init__(self, what: str, exc: ApiException) -> None:
        try:
            message = json.loads(exc.body or "{}").get("message", "")
        except ValueError:
            message = exc.body or ""
        super().__init__(f"{what}: Kubernetes answered {exc.status} {exc.reason}: {message or '(no message)'}; "
                         f"check the controller's RBAC on the namespace, or the object named")
        self.status = exc.status


def api_client(host: str, token: str = "", verify_ssl: bool = True) -> client.ApiClient:
    """A client for this API server address (tests: the fake's URL; a cluster: its https endpoint + a token)."""
    configuration = client.Configuration(host=host)
    configuration.verify_ssl = verify_ssl
    if token:
        configuration.api_key = {"authorization": token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(configuration)


def _pending(dep) -> list[str]:
    return json.loads((dep.metadata.annotations or {}).get(PENDING_ANNOTATION) or "[]")


def _labels(obj) -> dict:
    return obj.metadata.labels or {}


def _is_active(pod) -> bool:
    """Counted by its ReplicaSet: neither terminating nor finished (IsPodActive, kubernetes/pkg/controller/
    controller_utils.go)."""
    return pod.metadata.deletion_timestamp is None and pod.status.phase not in ("Failed", "Succeeded")


def _is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


class KubernetesExecutor:
    def __init__(self, api: client.ApiClient, fleet: K8sFleet, plan_for: Callable[[int], BuildPlan], *,
                 split: TrafficSplit | None = None, holds_source: Callable[[str], int] | None = None,
                 router_admin: Callable[[str, str], None] | None = None,
                 reload_gateway: Callable[[], None] | None = None) -> None:
        """plan_for(revision): the build plan of that revision's engines. holds_source(name): what the instance
        still holds (e.g. GatewayAdmin.holds); without one every alive instance holds -1 (unknown, busy).
        router_admin(name, state): tells the router; default PUT to the gateway Service with the admin token.
        reload_gateway(): after the fleet file changes (e.g. GatewayAdmin.reload); default none."""
        self.fleet = fleet
        self.plan_for = plan_for
        self.apps, self.core = client.AppsV1Api(api), client.CoreV1Api(api)
        self.net = client.NetworkingV1Api(api)
        self.split = split or TrafficSplit(stable_revision=1)
        self.holds_source = holds_source
        self.router_admin = router_admin or GatewayAdmin(fleet.gateway_url, admin_token(fleet.kv_key)).set_state
        self.reload_gateway = reload_gateway
        self._published = ""
        self._ensured: set[tuple[str, str]] = set()   # shared objects known to exist (created or found)

    # ---- the Executor protocol --------------------------------------------------------------------------
    def start(self, name: str, role: str, revision: int, shape: RoleShape) -> dict:
        dep_name = deployment_name(self.fleet.name, role, revision)
        record = {"namespace": self.fleet.namespace, "deployment": dep_name}
        if self._pods(f"{LABEL_INSTANCE}={name}"):
            return record                                   # already bound: a retried start
        manifests = fleet_manifests(self.fleet, self.plan_for(revision), revision, {role: shape}, {role: 1})
        for m in manifests:
            key = (m["kind"], m["metadata"]["name"])
            if key != ("Deployment", dep_name) and key not in self._ensured:
                self._create(m, exist_ok=True)
                self._ensured.add(key)
        own = next(m for m in manifests if (m["kind"], m["metadata"]["name"]) == ("Deployment", dep_name))
        own["metadata"]["annotations"][PENDING_ANNOTATION] = json.dumps([name])
        if not self._create(own, exist_ok=True):
            self._scale(dep_name, +1, add=name, fill_slack=True)
        return record

    def observe(self) -> list[ObservedInstance]:
        pods = self._pods()
        deployments = self._deployments()
        pending = self._bind(pods, deployments)
        observed = [self._observed(p) for p in pods if _labels(p).get(LABEL_STATE) != "stopped"]
        for dep in deployments:
            labels = _labels(dep)
            observed += [ObservedInstance(n, labels[LABEL_ROLE], int(labels[LABEL_REVISION]), alive=True,
                                          ready=False, reason=f"no pod yet: {dep.metadata.name} has not created it")
                         for n in pending[dep.metadata.name]]
        self._publish(pods)
        return observed

    def drain(self, name: str) -> None:
        """The fleet file first (a gateway that missed the PUT, or restarts, still reads it), then the gateway."""
        for pod in self._pods(f"{LABEL_INSTANCE}={name}"):
            self._patch_pod(pod, {"metadata": {"labels": {LABEL_STATE: "draining"}}})
        self._publish(self._pods())
        self.router_admin(name, "draining")

    def stop(self, name: str, force: bool = False, reason: str = "") -> None:
        pods = [p for p in self._pods(f"{LABEL_INSTANCE}={name}") if _labels(p).get(LABEL_STATE) != "stopped"
                or force]
        for pod in pods:
            labels = _labels(pod)
            self._patch_pod(pod, {"metadata": {"annotations": {DELETION_COST: STOP_COST},
                                               "labels": {LABEL_STATE: "stopped"}}})
            dep_name = deployment_name(self.fleet.name, labels[LABEL_ROLE], int(labels[LABEL_REVISION]))
            if labels.get(LABEL_STATE) != "stopped" and _is_active(pod):   # else the ReplicaSet replaced it already
                self._retire_if_empty(self._scale(dep_name, -1))
            if force:
                self._delete_pod(pod.metadata.name)
        if not pods:
            for dep in self._deployments():
                if name in _pending(dep):
                    self._retire_if_empty(self._scale(dep.metadata.name, -1, remove=name))
        self._publish(self._pods())

    def set_traffic(self, split: TrafficSplit) -> None:
        self.split = split
        self._publish(self._pods())
        if self.reload_gateway is not None:
            self.reload_gateway()
        for dep in self._deployments():
            self._retire_if_empty(dep)

    def apply_in_place(self, settings: dict) -> None:
        """The routing policy goes into the gateway's fleet file (the gateway re-reads it when it changes)."""
        if "routing" in settings:
            self.routing = settings["routing"]
        self._publish(self._pods())
        if self.reload_gateway is not None:
            self.reload_gateway()

    # ---- binding and observing --------------------------------------------------------------------------
    def relabel(self, names: list[str], revision: int) -> None:
        """Nothing to record: a pod's revision label is part of its Deployment's selector, so relabelling it
        would orphan it (its ReplicaSet would start another); the controller's table holds the new revision."""

    def wait_stopped(self) -> None:
        """Pods stop under Kubernetes, not in this process: nothing to wait for."""

    def _bind(self, pods: list, deployments: list) -> dict[str, list[str]]:
        """Binds unbound pods to pending names; returns each Deployment's names still without a pod."""
        left = {}
        for dep in deployments:
            pending = _pending(dep)
            labels = _labels(dep)
            free = sorted((p for p in pods if LABEL_INSTANCE not in _labels(p) and p.metadata.deletion_timestamp is None
                           and _labels(p).get(LABEL_ROLE) == labels[LABEL_ROLE]
                           and _labels(p).get(LABEL_REVISION) == labels[LABEL_REVISION]),
                          key=lambda p: (p.metadata.creation_timestamp, p.metadata.name))
            bound = list(zip(pending, free))
            for name, pod in bound:
                self._patch_pod(pod, {"metadata": {"labels": {LABEL_INSTANCE: name}}})
                pod.metadata.labels = {**_labels(pod), LABEL_INSTANCE: name}
            if bound:
                self._scale(dep.metadata.name, 0, remove=[n for n, _ in bound])
            left[dep.metadata.name] = pending[len(bound):]
        return left

    def _observed(self, pod) -> ObservedInstance:
        labels, status = _labels(pod), pod.status
        name = labels.get(LABEL_INSTANCE, pod.metadata.name)
        waiting = [c.state.waiting.reason for c in status.container_statuses or []
                   if c.state and c.state.waiting and c.state.waiting.reason]
        crashing = any(w in ("CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError")
                       for w in waiting)
        # Pending (scheduling, pulling, creating) is the controller's "starting": alive, not ready; the start
        # timeout bounds it. A container that crash-loops or cannot be pulled is not alive.
        alive = status.phase in ("Pending", "Running") and not crashing
        ready = status.phase == "Running" and not crashing and _is_ready(pod) and pod.metadata.deletion_timestamp is None
        reason = ""
        if LABEL_INSTANCE not in labels:
            reason = f"pod {pod.metadata.name} was not started by this controller (no {LABEL_INSTANCE} label)"
        elif pod.metadata.deletion_timestamp is not None:
            reason = "terminating"
        elif not ready and status.phase != "Running" or crashing:
            reason = f"pod {pod.metadata.name} is {status.phase}" + (f" ({', '.join(waiting)})" if waiting else "")
        elif not ready:
            reason = f"pod {pod.metadata.name} is Running, not Ready (GET /health does not answer 200 yet)"
        holds = (self.holds_source(name) if self.holds_source else -1) if ready else 0
        return ObservedInstance(name, labels.get(LABEL_ROLE, ""), int(labels.get(LABEL_REVISION, 0)), alive, ready,
                                holds, reason)

    def _publish(self, pods: list) -> None:
        """Writes the gateway's fleet file (ConfigMap) when what it would say changed."""
        live = [p for p in pods if LABEL_INSTANCE in _labels(p) and _labels(p).get(LABEL_STATE) != "stopped"
                and p.metadata.deletion_timestamp is None and p.status.pod_ip]
        instances = []
        for pod in sorted(live, key=lambda p: _labels(p)[LABEL_INSTANCE]):
            labels = _labels(pod)
            role, revision = labels[LABEL_ROLE], int(labels[LABEL_REVISION])
            spec = role_plan(self.plan_for(revision), role).spec
            instances.append(fleet_instance(labels[LABEL_INSTANCE], role, revision, pod.status.pod_ip,
                                            self.fleet.serve_port, spec,
                                            "draining" if labels.get(LABEL_STATE) == "draining" else "ready"))
        s = self.split
        traffic = {"stable_revision": s.stable_revision, "canary_revision": s.canary_revision,
                   "canary_share": s.canary_share, "changed_roles": list(s.changed_roles),
                   "canary_instances": [i.name for i in instances
                                        if s.canary_revision and i.revision == s.canary_revision
                                        and i.role in s.changed_roles]}
        roles = {_labels(p)[LABEL_ROLE] for p in pods}
        mode = "colocated" if roles == {"colocated"} else "disaggregated"   # the gateway serves one mode
        text = fleet_document(self.fleet.name, mode, self.fleet.engines.mount_path, self.fleet.model_path,
                              instances, traffic, getattr(self, "routing", None))
        if text == self._published:
            return
        name = fleet_configmap_name(self.fleet.name)
        try:
            self.core.patch_namespaced_config_map(name, self.fleet.namespace, {"data": {"fleet.json": text}},
                                                  _content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status != 404:
                raise KubernetesApiError(f"updating ConfigMap {name}", exc) from None
            configmap = fleet_configmap(self.fleet, mode, s.stable_revision)
            configmap["data"]["fleet.json"] = text
            self._create(configmap, exist_ok=False)
        self._published = text

    # ---- API calls ---------------------------------------------------------------------------------------
    def _pods(self, extra_selector: str = "") -> list:
        selector = self.fleet.role_selector() + (f",{extra_selector}" if extra_selector else "")
        try:
            return self.core.list_namespaced_pod(self.fleet.namespace, label_selector=selector).items
        except ApiException as exc:
            raise KubernetesApiError(f"listing pods {selector}", exc) from None

    def _deployments(self) -> list:
        try:
            return self.apps.list_namespaced_deployment(self.fleet.namespace,
                                                        label_selector=self.fleet.role_selector()).items
        except ApiException as exc:
            raise KubernetesApiError("listing the instance Deployments", exc) from None

    def _create(self, manifest: dict, exist_ok: bool) -> bool:
        """True when created; False when it existed (and exist_ok)."""
        create = {"Deployment": self.apps.create_namespaced_deployment,
                  "Service": self.core.create_namespaced_service,
                  "ConfigMap": self.core.create_namespaced_config_map,
                  "Secret": self.core.create_namespaced_secret,
                  "NetworkPolicy": self.net.create_namespaced_network_policy}[manifest["kind"]]
        try:
            create(self.fleet.namespace, manifest)
            return True
        except ApiException as exc:
            if exc.status == 409 and exist_ok:
                return False
            raise KubernetesApiError(f"creating {manifest['kind']} {manifest['metadata']['name']}", exc) from None

    def _scale(self, dep_name: str, delta: int, add: str = "", remove: str | list[str] = (),
               fill_slack: bool = False):
        """replicas += delta and the pending list edited, in one patch guarded by resourceVersion; returns the
        Deployment (None when it is gone). Adding a name already pending changes nothing (a retried start).
        fill_slack: no +1 while a replica has neither a bound live pod nor a pending name (see _slack)."""
        removed = {remove} if isinstance(remove, str) else set(remove)
        for attempt in range(RETRIES):
            try:
                dep = self.apps.read_namespaced_deployment(dep_name, self.fleet.namespace)
                if add and add in _pending(dep):
                    return dep
                pending = [n for n in _pending(dep) if n not in removed] + ([add] if add else [])
                patch = {"metadata": {"resourceVersion": dep.metadata.resource_version,
                                      "annotations": {PENDING_ANNOTATION: json.dumps(pending)}}}
                grow = delta if not (fill_slack and self._slack(dep) > 0) else 0
                if grow:
                    patch["spec"] = {"replicas": max(0, (dep.spec.replicas or 0) + grow)}
                return self.apps.patch_namespaced_deployment(dep_name, self.fleet.namespace, patch,
                                                             _content_type=MERGE_PATCH)
            except ApiException as exc:
                if exc.status == 409 and attempt + 1 < RETRIES:
                    continue
                if exc.status == 404:
                    return None
                raise KubernetesApiError(f"scaling Deployment {dep_name} by {delta:+d}", exc) from None

    def _slack(self, dep) -> int:
        """Replicas of the Deployment that no bound active pod and no pending name accounts for: a pod that went
        without stop(), which the ReplicaSet replaces by itself."""
        labels = _labels(dep)
        pods = self._pods(f"{LABEL_ROLE}={labels[LABEL_ROLE]},{LABEL_REVISION}={labels[LABEL_REVISION]}")
        bound = [p for p in pods if LABEL_INSTANCE in _labels(p) and _labels(p).get(LABEL_STATE) != "stopped"
                 and _is_active(p)]
        return (dep.spec.replicas or 0) - len(bound) - len(_pending(dep))

    def _retire_if_empty(self, dep) -> None:
        """Deletes a Deployment at 0 replicas unless its revision is the stable or the canary one."""
        if dep is None:
            return
        labels = _labels(dep)
        revision = int(labels[LABEL_REVISION])
        if dep.spec.replicas or _pending(dep) or revision in (self.split.stable_revision, self.split.canary_revision):
            return
        ns = self.fleet.namespace
        for delete, name in ((self.apps.delete_namespaced_deployment, dep.metadata.name),
                             (self.core.delete_namespaced_config_map,
                              serve_config_name(self.fleet.name, labels[LABEL_ROLE], revision))):
            self._ensured.discard(("ConfigMap", name))
            try:
                delete(name, ns, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise KubernetesApiError(f"deleting {name}", exc) from None

    def _patch_pod(self, pod, patch: dict) -> None:
        try:
            self.core.patch_namespaced_pod(pod.metadata.name, self.fleet.namespace, patch, _content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status != 404:                           # gone already: nothing left to mark
                raise KubernetesApiError(f"patching pod {pod.metadata.name}", exc) from None

    def _delete_pod(self, pod_name: str) -> None:
        try:
            self.core.delete_namespaced_pod(pod_name, self.fleet.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise KubernetesApiError(f"deleting pod {pod_name}", exc) from None
