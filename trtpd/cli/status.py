"""`trtpd status`: what runs, where, and how full its KV caches are."""

from __future__ import annotations

import argparse
import time
import urllib.request


def kv_usage(metrics_url: str) -> dict[str, str]:
    """model -> 'used/max blocks' from nv_trt_llm_kv_cache_block_metrics."""
    try:
        text = urllib.request.urlopen(metrics_url, timeout=2).read().decode()
    except OSError:
        return {}
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("nv_trt_llm_kv_cache_block_metrics{"):
            labels, value = line[line.index("{") + 1:line.index("}")], float(line.rsplit(" ", 1)[1])
            fields = dict(part.split("=", 1) for part in labels.split(","))
            values[(fields["model"].strip('"'), fields["kv_cache_block_type"].strip('"'))] = value
    models = sorted({m for m, _ in values})
    return {m: f"{values.get((m, 'used'), 0):.0f}/{values.get((m, 'max'), 0):.0f}" for m in models}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="list deployments and their state", description="List deployments.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from trtpd.serving import deployment

    deps = deployment.list_deployments()
    if not deps:
        print("no deployments (start one with `trtpd up`)")
        return 0
    table = Table("name", "mode", "pid", "state", "HTTP", "gRPC", "metrics", "KV blocks used/max", "up")
    for dep in deps:
        s = dep.server
        state = "ready" if s.is_ready() else ("starting" if s.is_alive() else "dead")
        usage = kv_usage(s.metrics_url) if state == "ready" else {}
        table.add_row(dep.name, dep.mode, str(s.pid), state, s.http_url, s.grpc_url, s.metrics_url,
                      ", ".join(f"{m} {u}" for m, u in usage.items()) or "-",
                      f"{time.time() - dep.started_at:.0f} s")
    Console().print(table)
    return 0
