"""`trtpd scale NAME prefill=2 decode=3`: change a running deployment's instance counts (drain-aware)."""

from __future__ import annotations

import argparse

from trtpd.cli import args as a


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scale", help="change a deployment's instance counts (the controller drains before it stops)",
                       description="Ask the deployment's controller for new instance counts. Added instances get "
                                   "traffic once ready; removed ones get no new request at once and stop when what "
                                   "they hold has finished (prefill: every KV export pulled or expired; decode: "
                                   "every stream ended), or at the spec's rollout.drain_timeout_s.")
    p.add_argument("name", help="deployment name")
    p.add_argument("counts", nargs="+", metavar="ROLE=N", help="e.g. prefill=2 decode=3")
    p.add_argument("--no-wait", action="store_true", help="return once the controller accepted the change")
    p.add_argument("--timeout-s", type=float, default=300.0, help="how long to wait for the new counts")
    p.set_defaults(func=run)


def parse_counts(items: list[str]) -> dict[str, int]:
    counts = {}
    for item in items:
        role, sep, n = item.partition("=")
        if not sep or not n.isdigit() or role not in ("prefill", "decode", "colocated"):
            raise a.ConfigError(f"{item!r}: expected ROLE=N with ROLE prefill, decode or colocated and N a whole number")
        counts[role] = int(n)
    return counts


def run(args: argparse.Namespace) -> int:
    from trtpd.cli.controller_client import last_audit_id, open_store, submit_and_wait, wait_converged

    counts = parse_counts(args.counts)
    store = open_store(args.name)
    since = last_audit_id(store)
    result = submit_and_wait(args.name, "scale", {"counts": counts})
    world = f" as a new world (revision {result['revision']}, rolled out like `trtpd rollout`)" \
        if result.get("world") else ""
    print(f"{args.name}: {result['from']} -> {result['to']}{world}")
    if args.no_wait:
        return 0
    wait_converged(args.name, args.timeout_s, since)
    if result.get("world"):      # a new world that failed its gate was drained: the counts did not change
        status = store.revision(result["revision"]).status
        print(f"revision {result['revision']}: {'promoted' if status == 'promoted' else status.replace('_', ' ')}")
        return 0 if status == "promoted" else 1
    return 0
