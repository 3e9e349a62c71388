"""`trtpd status`: what runs, where, how full its KV caches are, and why a deployment failed."""

from __future__ import annotations

import argparse
import json
import time


def _metric_lines(metrics_url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of metric `name` on a Triton metrics endpoint."""
    from trtpd.metrics_text import fetch, samples
    text = fetch(metrics_url)
    return [] if text is None else samples(text, name)


def kv_usage(metrics_url: str) -> dict[str, str]:
    """model -> 'used/max blocks' from nv_trt_llm_kv_cache_block_metrics."""
    values = {(f["model"], f["kv_cache_block_type"]): v
              for f, v in _metric_lines(metrics_url, "nv_trt_llm_kv_cache_block_metrics")}
    models = sorted({m for m, _ in values})
    return {m: f"{values.get((m, 'used'), 0):.0f}/{values.get((m, 'max'), 0):.0f}" for m in models}


def batch_invariance(metrics_url: str) -> dict[str, int]:
    """model -> the largest forward pass (rows) whose batch invariance its engine verified at load."""
    return {f["model"]: int(v) for f, v in _metric_lines(metrics_url, "trtpd_batch_invariance_verified_rows")}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="list deployments and their state",
                       description="List deployments: state (ready, starting, failed: a model's stub died, "
                                   "exited), endpoints, KV usage.")
    p.add_argument("--name", help="only this deployment (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from trtpd.fleet import deployment

    from trtpd.fleet import records
    from trtpd.fleet.state import fleet_view

    from trtpd.controller.daemon import is_kubernetes, kubernetes_deployments

    clusters = [args.name] if args.name and is_kubernetes(args.name) else [] if args.name else kubernetes_deployments()
    if args.name and clusters:
        deps, fleets = [], []
    elif args.name and records.is_fleet(args.name):
        deps, fleets = [], [fleet_view(records.load_fleet(args.name))]
    else:
        deps = [deployment.Deployment.load(args.name)] if args.name else deployment.list_deployments()
        fleets = [] if args.name else [fleet_view(f) for f in records.list_fleets()]
    if clusters:
        from trtpd.controller.k8s.cluster import kubernetes_view
        fleets += [kubernetes_view(name) for name in clusters]
    for fleet in fleets:
        fleet["controller"] = controller_view(fleet["name"])
    rows = []
    for dep in deps:
        s = dep.server
        state, reason = dep.state()
        rows.append({"name": dep.name, "mode": dep.mode, "pid": s.pid, "state": state, "reason": reason,
                     "http": s.http_url, "grpc": s.grpc_url, "metrics": s.metrics_url,
                     "kv_blocks": kv_usage(s.metrics_url) if state == "ready" else {},
                     "batch_invariance_rows": batch_invariance(s.metrics_url) if state == "ready" else {},
                     "death": dep.death(), "up_s": round(time.time() - dep.started_at)})
    if args.json:
        print(json.dumps(rows + fleets, indent=2))   # fleets: "kind": "fleet", one entry per instance
        return 0
    if not rows and not fleets:
        print("no deployments (start one with `trtpd up`)")
        return 0
    for fleet in fleets:
        (print_kubernetes if fleet.get("kind") == "kubernetes" else print_fleet)(fleet)
    if not rows:
        return 0
    table = Table("name", "mode", "pid", "state", "HTTP", "gRPC", "metrics", "KV blocks used/max", "up")
    for r in rows:
        table.add_row(r["name"], r["mode"], str(r["pid"]), r["state"], r["http"], r["grpc"], r["metrics"],
                      ", ".join(f"{m} {u}" for m, u in r["kv_blocks"].items()) or "-", f"{r['up_s']} s")
    Console().print(table)
    for r in rows:
        if r["batch_invariance_rows"]:
            print(f"{r['name']}: batch invariance verified at load for forward passes up to "
                  + ", ".join(f"{m} {n} rows" for m, n in sorted(r["batch_invariance_rows"].items())))
        if r["reason"]:
            print(f"{r['name']}: {r['state']}: {r['reason']}")
            if r["state"] == "failed":
                print(f"  stop it with `trtpd down --name {r['name']}`, then `trtpd up` again")
    return 0


def controller_view(name: str) -> dict | None:
    """The deployment's controller, if it has one: process, stable revision, counts, a rollout in progress."""
    from trtpd.fleet.deployment import deployment_dir

    if not (deployment_dir(name) / "controller.db").is_file():
        return None
    from trtpd.controller.daemon import controller_alive
    from trtpd.controller.store import ControllerStore

    store = ControllerStore.for_deployment(name)
    alive = controller_alive(store)
    rollout = store.get("rollout")
    counts, stable = store.get("counts"), store.get("stable_revision")
    if counts and "world" in counts and stable:    # backend tensorrt-llm: what the stable world holds
        counts = {**counts, **{f"world {r}": role["instances"] for r, role in
                               store.revision(int(stable)).spec_json["roles"].items() if role}}
    return {"pid": alive["pid"] if alive else None, "running": alive is not None,
            "stable_revision": stable, "counts": counts,
            "rollout": {k: rollout[k] for k in ("revision", "phase", "reason")} if rollout else None}


def print_kubernetes(view: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    ready = view["gateway_ready_replicas"]
    table = Table("instance", "role", "rev", "state", "pod", "phase", "pod IP",
                  title=f"{view['name']} ({view['mode']}) on Kubernetes, namespace {view['namespace']}: gateway "
                        f"{view['gateway_url']} ({'?' if ready is None else ready} ready)")
    for i in view["instances"]:
        table.add_row(i["name"], i["role"], str(i["revision"]), i["state"], i["pod"] or "-", i["phase"] or "-",
                      i["pod_ip"] or "-")
    Console().print(table)
    _print_controller(view)
    if view["error"]:
        print(f"{view['name']}: {view['error']}")
    for i in view["instances"]:
        if i["reason"]:
            print(f"{view['name']}: {i['name']} {i['state']}: {i['reason']}")


def _print_controller(fleet: dict) -> None:
    c = fleet.get("controller")
    if c:
        r = c["rollout"]
        print(f"{fleet['name']}: controller {'pid ' + str(c['pid']) if c['running'] else 'NOT running'}, "
              f"revision {c['stable_revision']}, counts {c['counts']}"
              + (f", rollout of revision {r['revision']}: {r['phase']}" if r else ""))


def print_fleet(fleet: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("instance", "role", "pid", "state", "gRPC", "HTTP", "metrics", "KV", "cpus",
                  "waiting/active", "KV blocks used/max",
                  title=f"fleet {fleet['name']} ({fleet['mode']}): {fleet['state']}, up {fleet['up_s']} s")
    for i in fleet["instances"]:
        load = i["load"]
        table.add_row(i["name"], i["role"], str(i["pid"]), i["state"], i["grpc"], i["http"], i["metrics"],
                      i["kv"] or "-", ",".join(map(str, i["cpus"])),
                      f"{load['waiting']}/{load['active']}" if "waiting" in load else "-",
                      f"{load['kv_used']}/{load['kv_max']}" if "kv_max" in load else "-")
    Console().print(table)
    _print_controller(fleet)
    if fleet["shared_cores"]:
        print(f"{fleet['name']}: more instances than cores: instances share cores")
    for i in fleet["instances"]:
        if i["reason"]:
            print(f"{fleet['name']}: {i['state']}: {i['reason']}")
    if fleet["state"] in ("failed", "exited"):
        print(f"  stop it with `trtpd down --name {fleet['name']}`, then `trtpd up --fleet` again")
