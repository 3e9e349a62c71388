"""What each instance of a fleet is doing: state (ready | starting | failed | exited), endpoints, load."""

from __future__ import annotations

import time

from trtpd.fleet.instance import instance_folder, shares_cores
from trtpd.fleet.records import FleetRecord, InstanceRecord
from trtpd.metrics_text import fetch, samples
from trtpd.serving import stub_watch
from trtpd.fleet.deployment import server_state


def instance_state(fleet: FleetRecord, inst: InstanceRecord) -> tuple[str, str]:
    """(state, reason). failed: a stub of it died (its death record names the model and pid)."""
    death = stub_watch.read_death(instance_folder(fleet, inst.name))
    if death is not None and death.get("server_pid") != inst.server.pid:
        death = None                      # a record of an earlier server of this instance
    state, reason = server_state(inst.server, death, "its")
    return state, f"{inst.name}: {reason}" if reason else ""


def load(metrics_url: str, model: str) -> dict[str, int]:
    """waiting, active requests and KV blocks used/max of `model` from its metrics endpoint ({}: unreadable)."""
    text = fetch(metrics_url)
    if text is None:
        return {}
    wanted = {("nv_trt_llm_request_metrics", "request_type", "waiting"): "waiting",
              ("nv_trt_llm_request_metrics", "request_type", "active"): "active",
              ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "used"): "kv_used",
              ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "max"): "kv_max"}
    out = {}
    for (metric, key, value), field in wanted.items():
        for labels, number in samples(text, metric):
            if labels.get("model") == model and labels.get(key) == value:
                out[field] = int(number)
    return out


def instance_view(fleet: FleetRecord, inst: InstanceRecord) -> dict:
    state, reason = instance_state(fleet, inst)
    return {"name": inst.name, "role": inst.role, "state": state, "reason": reason, "pid": inst.server.pid,
            "start_time": inst.server.start_time, "grpc": inst.grpc_url, "http": inst.http_url,
            "metrics": inst.metrics_url, "kv": inst.kv_advertise, "cpus": inst.cpus,
            # a trtllm-serve worker's /metrics hands each iteration's stats out once: the gateway's probe reads them
            "load": _load(inst) if state == "ready" and inst.protocol == "triton-grpc" else {}}


def _load(inst: InstanceRecord) -> dict[str, int]:
    """An instance's load; a world's: its role models' together."""
    if not inst.world_roles:
        return load(inst.metrics_url, inst.model)
    total: dict[str, int] = {}
    for role in inst.world_roles:
        for key, value in load(inst.metrics_url, role).items():
            total[key] = total.get(key, 0) + value
    return total


def fleet_view(fleet: FleetRecord) -> dict:
    instances = [instance_view(fleet, i) for i in fleet.instances]
    states = {i["state"] for i in instances}
    state = "ready" if states == {"ready"} else next((s for s in ("failed", "exited", "starting") if s in states),
                                                      "empty")
    from trtpd.fleet.gateway_process import running_gateway
    from trtpd.process_identity import is_running

    gateway = dict(fleet.gateway or {})
    if gateway:
        now = running_gateway(gateway)   # supervisord may have restarted it under a new pid
        gateway.update({"pid": now["pid"], "start_time": now["start_time"], "running": True} if now else
                       {"running": False})
    sup = fleet.supervisor
    supervisor = {**sup, "running": is_running(int(sup["pid"]), sup.get("start_time"))} if sup else None
    return {"name": fleet.name, "kind": "fleet", "mode": fleet.mode, "state": state,
            "instances": instances, "gateway": gateway or None, "supervisor": supervisor,
            "shared_cores": shares_cores([i.cpus for i in fleet.instances]),
            "up_s": round(time.time() - fleet.started_at)}
