"""A deployment on Kubernetes from the CLI: the API connection a spec names, the controller's executor built from
the stored spec, `trtpd up -f` (bring_up_kubernetes), `trtpd status` (kubernetes_view) and `trtpd down`
(down_kubernetes).

The controller store is the local executor's (revisions, instance table, commands from `trtpd scale` / `rollout`,
audit log), so those commands and `trtpd history` work unchanged; the stable revision's spec says where it runs
(daemon.is_kubernetes). The
controller process runs on this machine under supervisord, as for a local fleet; the gateway runs in the cluster.
"""

from __future__ import annotations

import time
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from trtpd.controller.controller import Controller
from trtpd.controller.k8s.executor import KubernetesApiError, KubernetesExecutor
from trtpd.controller.k8s.from_spec import build_plan, gateway_url, k8s_fleet
from trtpd.controller.k8s.gateway_admin import GatewayAdmin, GatewayHolds, admin_token
from trtpd.controller.k8s.manifests import LABEL_APP, LABEL_FLEET, K8sFleet, api_key_secret_name, fleet_manifests
from trtpd.controller.spec import DeploymentSpec, KubernetesSpec
from trtpd.controller.store import ControllerStore, actor
from trtpd.controller.types import TrafficSplit
from trtpd.errors import ConfigError, TrtpdError
from trtpd.fleet import deployment

REQUEST_TIMEOUT_S = 10.0
GATEWAY_READY_S = 120.0     # after the instances: the gateway pod's image pull and start


def connect(k: KubernetesSpec) -> client.ApiClient:
    """A client for the cluster the spec names: api_server (+ token_file, ca_file), in_cluster, or a kubeconfig."""
    configuration = client.Configuration()
    try:
        if k.in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        elif k.api_server is None:
            config.load_kube_config(config_file=str(k.kubeconfig) if k.kubeconfig else None, context=k.context,
                                    client_configuration=configuration, persist_config=False)
        else:
            configuration.host = k.api_server
            if k.ca_file is not None:
                configuration.ssl_ca_cert = str(k.ca_file)
            if k.token_file is not None:
                configuration.api_key_prefix = {"authorization": "Bearer"}
                configuration.api_key = {"authorization": _token(k.token_file)}
                # the client calls this before each request: a rotated token file is picked up
                configuration.refresh_api_key_hook = lambda c: c.api_key.update(authorization=_token(k.token_file))
    except ConfigException as exc:
        field = "in_cluster" if k.in_cluster else "kubeconfig"
        raise ConfigError(f"kubernetes.{field}: {exc}") from None
    return client.ApiClient(configuration)


def _token(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"kubernetes.token_file: {path}: {exc.strerror}") from None


def _key(name: str) -> bytes:
    from trtpd.kv.handle import load_or_create_key_file
    from trtpd.repo.reference import KEY_FILE
    return load_or_create_key_file(deployment.deployment_dir(name) / KEY_FILE)


def _stable_spec(store: ControllerStore) -> DeploymentSpec:
    return DeploymentSpec.from_json(store.revision(int(store.get("stable_revision"))).spec_json)


def kubernetes_controller(store: ControllerStore, spec: DeploymentSpec) -> Controller:
    """The controller over a KubernetesExecutor: each revision's build plan from its stored spec, holds, drains
    and request samples from the gateway."""
    key = _key(spec.name)
    fleet = k8s_fleet(spec, key)
    gateway = GatewayAdmin(gateway_url(spec, fleet), admin_token(key))
    plans = {}

    def plan_for(revision: int):
        if revision not in plans:
            plans[revision] = build_plan(DeploymentSpec.from_json(store.revision(revision).spec_json))
        return plans[revision]

    traffic = store.get("traffic")
    split = TrafficSplit(**{**traffic, "changed_roles": tuple(traffic["changed_roles"]),
                            "canary_instances": tuple(traffic["canary_instances"])}) if traffic else \
        TrafficSplit(stable_revision=int(store.get("stable_revision", 1)))
    executor = KubernetesExecutor(connect(spec.kubernetes), fleet, plan_for, split=split,
                                  holds_source=GatewayHolds(gateway), router_admin=gateway.set_state)
    return Controller(store, executor, samples=gateway.samples, health=gateway.health)


# ---- the deployment's objects ----------------------------------------------------------------------

def _kinds(api: client.ApiClient) -> list[tuple[str, object, object]]:
    """(kind, list, delete) in the order `down` deletes them: the gateway's Deployment first (no new request),
    then the instances' (their pods get the preStop pause), then what they mounted or were reached by."""
    apps, core, net = client.AppsV1Api(api), client.CoreV1Api(api), client.NetworkingV1Api(api)
    return [("Deployment", apps.list_namespaced_deployment, apps.delete_namespaced_deployment),
            ("Service", core.list_namespaced_service, core.delete_namespaced_service),
            ("NetworkPolicy", net.list_namespaced_network_policy, net.delete_namespaced_network_policy),
            ("ConfigMap", core.list_namespaced_config_map, core.delete_namespaced_config_map),
            ("Secret", core.list_namespaced_secret, core.delete_namespaced_secret)]


def _selector(fleet: K8sFleet) -> str:
    return f"{LABEL_APP}=trtpd,{LABEL_FLEET}={fleet.name}"


def list_objects(api: client.ApiClient, fleet: K8sFleet) -> list[tuple[str, str]]:
    out = []
    for kind, list_fn, _ in _kinds(api):
        try:
            items = list_fn(fleet.namespace, label_selector=_selector(fleet), _request_timeout=REQUEST_TIMEOUT_S).items
        except ApiException as exc:
            raise KubernetesApiError(f"listing {kind}s of {fleet.name} in namespace {fleet.namespace}", exc) from None
        names = sorted(i.metadata.name for i in items)
        if kind == "Deployment":   # the gateway's first
            names.sort(key=lambda n: n != f"{fleet.name}-gateway")
        out += [(kind, n) for n in names]
    return out


def delete_objects(api: client.ApiClient, fleet: K8sFleet) -> list[tuple[str, str]]:
    """Deletes every object labelled as this deployment's; pods go with their Deployments (background garbage
    collection, each pod through its preStop pause and grace period)."""
    deletes = {kind: delete for kind, _, delete in _kinds(api)}
    deleted = []
    for kind, name in list_objects(api, fleet):
        try:
            deletes[kind](name, fleet.namespace, propagation_policy="Background", _request_timeout=REQUEST_TIMEOUT_S)
            deleted.append((kind, name))
        except ApiException as exc:
            if exc.status != 404:
                raise KubernetesApiError(f"deleting {kind} {name}", exc) from None
    return deleted


def gateway_ready_replicas(api: client.ApiClient, fleet: K8sFleet) -> int:
    try:
        dep = client.AppsV1Api(api).read_namespaced_deployment(f"{fleet.name}-gateway", fleet.namespace,
                                                               _request_timeout=REQUEST_TIMEOUT_S)
    except ApiException as exc:
        if exc.status == 404:
            return 0
        raise KubernetesApiError(f"reading Deployment {fleet.name}-gateway", exc) from None
    return (dep.status.ready_replicas or 0) if dep.status else 0


# ---- up, down, status --------------------------------------------------------------------------------

def bring_up_kubernetes(spec: DeploymentSpec, spec_path: Path, *, timeout_s: float, daemon: bool = True,
                        progress=print) -> dict:
    """Records the revision, applies the gateway and the role Deployments through the executor (ticking the
    controller here), waits for every instance pod and the gateway to be ready (bounded by the larger of
    timeout_s and the spec's rollout.start_timeout_s), then starts the controller process. On failure every
    object it applied is deleted again."""
    from trtpd.controller.daemon import (controller_alive, mark_all_stopped, new_controller, record_revision,
                                         tick_until_ready, wait_controller)
    from trtpd.fleet.records import has_record

    name = spec.name
    if has_record(name):
        raise TrtpdError(f"{name!r} is a local deployment here; `trtpd down --name {name}` first, or rename it")
    store = ControllerStore.for_deployment(name)
    if controller_alive(store):
        raise TrtpdError(f"deployment {name!r} has a controller running (pid {store.get('controller')['pid']}); "
                         f"`trtpd down --name {name}` first")
    fleet = k8s_fleet(spec, _key(name))
    fleet_manifests(fleet, build_plan(spec), 1, spec.role_shapes(), spec.counts())   # refuses a bad shape now
    api = connect(spec.kubernetes)
    try:
        left = list_objects(api, fleet)
    except HTTPError as exc:
        raise TrtpdError(f"kubernetes: cannot reach the API server ({exc}); check kubernetes.api_server or the "
                         f"kubeconfig") from None
    if left:
        raise TrtpdError(f"namespace {fleet.namespace} still has {len(left)} object(s) of {name!r} ("
                         f"{', '.join(f'{k} {n}' for k, n in left[:3])}, ...); `trtpd down --name {name}` first")
    revision = record_revision(store, spec, spec_path)
    controller = new_controller(store, name, spec.mode)
    started = time.monotonic()
    try:
        tick_until_ready(controller, store, revision, max(timeout_s, spec.rollout.start_timeout_s))
        _wait(lambda: gateway_ready_replicas(api, fleet) > 0, GATEWAY_READY_S, f"Deployment {name}-gateway ready")
        progress(f"{name}: {len(store.instances(states=('ready',)))} instance pods ready in "
                 f"{time.monotonic() - started:.1f} s")
        if daemon:
            store.put("supervisor", _start_controller(name))
            wait_controller(name)
    except BaseException as exc:
        _stop_controller(store, name)
        try:
            delete_objects(api, fleet)
        except (TrtpdError, HTTPError) as again:
            progress(f"{name}: could not delete what was applied ({again}); `trtpd down --name {name}` later")
        mark_all_stopped(name, "trtpd up failed")
        if isinstance(exc, HTTPError):
            raise TrtpdError(f"kubernetes: the API server stopped answering ({exc})") from None
        raise
    return {"name": name, "revision": revision, "roles": list(spec.role_names), "gateway": None,
            "instances": [r.name for r in store.instances(states=("ready",))],
            "kubernetes": {"namespace": fleet.namespace, "gateway_url": gateway_url(spec, fleet),
                           "api_key_secret": api_key_secret_name(name)}}


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TrtpdError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def _start_controller(name: str) -> dict:
    """The controller process under supervisord (restarted if it dies), its deaths in the audit log."""
    import sys

    from trtpd.fleet.supervisor import Program, start_supervisor
    folder = deployment.deployment_dir(name)
    program = Program("controller", [sys.executable, "-m", "trtpd.controller", "run", "--name", name],
                      folder / "controller.log", priority=200)
    listener = [sys.executable, "-m", "trtpd.controller.supervisor_events", "--name", name]
    return start_supervisor(name, folder / "supervisor", [program], listener)


def _stop_controller(store: ControllerStore, name: str) -> int | None:
    """supervisord first (it stops the controller and stays down), then a controller that outlived it."""
    from trtpd.controller.daemon import controller_alive, stop_controller
    from trtpd.fleet.supervisor import stop_supervisor
    alive = controller_alive(store)
    stop_supervisor(store.get("supervisor"))
    store.put("supervisor", None)
    stop_controller(name)
    return int(alive["pid"]) if alive else None


def down_kubernetes(name: str) -> dict:
    """Stops the controller (first: it would replace what goes), deletes the deployment's objects, closes the
    instance table."""
    from trtpd.controller.daemon import mark_all_stopped
    store = ControllerStore.for_deployment(name)
    pid = _stop_controller(store, name)
    spec = _stable_spec(store)
    fleet = k8s_fleet(spec, _key(name))
    deleted = delete_objects(connect(spec.kubernetes), fleet)
    mark_all_stopped(name, "trtpd down")
    store.audit(actor(), "kubernetes_deleted", int(store.get("stable_revision", 0)),
                {"namespace": fleet.namespace, "objects": [f"{k}/{n}" for k, n in deleted]})
    return {"controller_pid": pid, "namespace": fleet.namespace, "deleted": deleted}


def kubernetes_view(name: str) -> dict:
    """`trtpd status`: the controller's instance table joined with the pods the API lists now."""
    store = ControllerStore.for_deployment(name)
    spec = _stable_spec(store)
    fleet = k8s_fleet(spec, _key(name))
    view = {"kind": "kubernetes", "name": name, "mode": spec.mode, "namespace": fleet.namespace,
            "gateway_url": gateway_url(spec, fleet), "gateway_ready_replicas": None, "error": "", "instances": []}
    pods = {}
    try:
        api = connect(spec.kubernetes)
        for pod in client.CoreV1Api(api).list_namespaced_pod(fleet.namespace, label_selector=fleet.role_selector(),
                                                              _request_timeout=REQUEST_TIMEOUT_S).items:
            pods.setdefault((pod.metadata.labels or {}).get("trtpd.dev/instance", ""), pod)
        view["gateway_ready_replicas"] = gateway_ready_replicas(api, fleet)
    except (ApiException, HTTPError, TrtpdError) as exc:
        view["error"] = f"the API server did not answer: {exc}"
    for row in store.instances(states=("starting", "ready", "draining", "failed")):
        pod = pods.get(row.name)
        view["instances"].append({
            "name": row.name, "role": row.role, "revision": row.revision, "state": row.state, "reason": row.reason,
            "pod": pod.metadata.name if pod else None, "phase": pod.status.phase if pod else None,
            "pod_ip": pod.status.pod_ip if pod else None, "deployment": row.detail.get("deployment")})
    return view
