"""`trtpd down`: stop a deployment cleanly (SIGTERM, wait, clean up shared memory)."""

from __future__ import annotations

import argparse

from trtpd.cli import args as a


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("down", help="stop a deployment", description="Stop a deployment started by `trtpd up`.")
    p.add_argument("--name", default="default", help="deployment name (default: %(default)s)")
    p.add_argument("--all", action="store_true", help="stop every deployment")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtpd.fleet import deployment

    if args.all:
        a.refuse_given(args, ("name",), "--all stops every deployment; give --name or --all")
    from trtpd.fleet import records
    from trtpd.fleet.launcher import fleet_down

    from trtpd.controller.daemon import is_kubernetes, kubernetes_deployments, mark_all_stopped, stop_controller
    clusters = kubernetes_deployments() if args.all else [args.name] if is_kubernetes(args.name) else []
    if args.all:
        names, fleets = [d.name for d in deployment.list_deployments()], [f.name for f in records.list_fleets()]
    elif clusters:
        names, fleets = [], []
    else:
        names, fleets = ([], [args.name]) if records.is_fleet(args.name) else ([args.name], [])
    for name in clusters:
        from trtpd.controller.k8s.cluster import down_kubernetes
        gone = down_kubernetes(name)
        if gone["controller_pid"]:
            print(f"stopped the controller of {name} (pid {gone['controller_pid']})")
        print(f"deleted {name} from namespace {gone['namespace']} ("
              f"{', '.join(f'{kind} {n}' for kind, n in gone['deleted']) or 'nothing was left'})")
    for name in fleets:
        pid = stop_controller(name)   # first, or it would replace the instances being stopped
        if pid:
            print(f"stopped the controller of {name} (pid {pid})")
        fleet, notes = fleet_down(name)
        mark_all_stopped(name, "trtpd down")
        for note in notes:
            print(f"{name}: {note}")
        print(f"stopped fleet {name} ({', '.join(f'{i.name} pid {i.server.pid}' for i in fleet.instances)})")
    for name in names:
        dep = deployment.down(name)
        if dep.note:
            print(f"{name}: {dep.note}")
        print(f"stopped {name} (pid {dep.server.pid})")
    if not names and not fleets and not clusters:
        print("no deployments")
    return 0

