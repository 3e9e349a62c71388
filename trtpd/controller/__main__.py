"""`python -m trtpd.controller run --name NAME`: the controller of a deployment (started by `trtpd up -f`)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtpd.controller", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="reconcile the deployment until SIGTERM")
    run.add_argument("--name", required=True, help="deployment name")
    run.add_argument("--interval-s", type=float, default=0.5, help="seconds between passes")
    args = p.parse_args(argv)

    from trtpd.controller.daemon import run_controller
    from trtpd.errors import TrtpdError

    try:
        run_controller(args.name, args.interval_s)
    except TrtpdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
