"""`trtpd history NAME`: a deployment's revisions and the controller's audit log."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("history", help="a deployment's revisions and audit log",
                       description="Every revision (who applied it, when, from which file, what became of it) and "
                                   "every decision the controller took (starts, drains, replacements, rollout "
                                   "phases with what the gate measured).")
    p.add_argument("name", help="deployment name")
    p.add_argument("--json", action="store_true", help="machine-readable")
    p.add_argument("--limit", type=int, default=0, help="only the last N audit entries (0: all)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import time

    from trtpd.cli.controller_client import format_event, open_store

    store = open_store(args.name)
    revisions = store.revisions()
    log = store.audit_log()
    if args.limit:
        log = log[-args.limit:]
    if args.json:
        print(json.dumps({"revisions": [{"number": r.number, "created_at": r.created_at, "author": r.author,
                                         "source": r.source, "status": r.status, "note": r.note} for r in revisions],
                          "audit": [{"id": e.id, "ts": e.ts, "actor": e.actor, "action": e.action,
                                     "revision": e.revision, "detail": e.detail} for e in log]}, indent=2))
        return 0
    print(f"{'REV':<4} {'STATUS':<12} {'CREATED':<20} {'AUTHOR':<28} SOURCE / NOTE")
    for r in revisions:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created_at))
        print(f"{r.number:<4} {r.status:<12} {created:<20} {r.author[:28]:<28} {r.source}"
              f"{'  (' + r.note + ')' if r.note else ''}")
    print()
    for e in log:
        print(format_event(e))
    return 0
