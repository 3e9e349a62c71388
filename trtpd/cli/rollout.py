"""`trtpd rollout SPEC.yaml`: roll a new revision of a deployment out (lint, diff, canary, gate, promote or
roll back); `trtpd rollout --undo NAME`: back to the revision before the current one."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="roll out a new revision (canary, SLO gate, promote or roll back)",
                       description="Lint the new spec (trtpd lint's rules and KV compatibility with every instance it "
                                   "will exchange KV with), show the diff, then let the controller start a canary per "
                                   "changed role, gate it on live TTFT/ITL/errors against the stable revision over the "
                                   "bake window, and promote it instance by instance or roll it back. Changes no "
                                   "instance needs a restart for (routing, SLOs, limits, policies) apply in place. "
                                   "Exit status: 0 promoted or applied, 1 rolled back, 2 refused.")
    p.add_argument("spec", nargs="?", metavar="SPEC.yaml", help="the new deployment spec")
    p.add_argument("--undo", metavar="NAME", help="roll the deployment NAME back to its previous revision")
    p.add_argument("--dry-run", action="store_true", help="lint and show the diff only")
    p.add_argument("--no-wait", action="store_true", help="return once the controller started it")
    p.add_argument("--timeout-s", type=float, default=900.0, help="how long to follow it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtpd.cli.rollout_flow import rollout
    from trtpd.cli.args import ConfigError

    if bool(args.spec) == bool(args.undo):
        raise ConfigError("give a SPEC.yaml or --undo NAME (one of them)")
    return rollout(args.spec, undo=args.undo, dry_run=args.dry_run, wait=not args.no_wait, timeout_s=args.timeout_s)
