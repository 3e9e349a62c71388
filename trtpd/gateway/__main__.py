"""`python -m trtpd.gateway --fleet-file FLEET.json`: the gateway for a running fleet (uvicorn on 127.0.0.1).
`trtpd up --fleet` starts it; run it by hand to put a second gateway in front of the same fleet."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtpd.gateway", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fleet-file", required=True,
                   help="the fleet's record: <TRTPD_HOME>/deployments/<name>/fleet.json")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=0, help="port (0: a free one, written to the port file)")
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--api-key-file", help="file with one API key per line (default: no key needed)")
    p.add_argument("--max-inflight", type=int, default=64, help="requests served at once")
    p.add_argument("--max-queued", type=int, default=256, help="waiting requests beyond which clients get 429")
    p.add_argument("--slo-ttft-s", type=float, default=1.0, help="TTFT target for live goodput")
    p.add_argument("--slo-tpot-s", type=float, default=0.1, help="TPOT target for live goodput")
    p.add_argument("--wait-for-instance-s", type=float, default=15.0,
                   help="a request that finds no ready instance of a role it needs waits this long for one (a "
                        "replacement being started) before it gets 503")
    args = p.parse_args(argv)

    from trtpd.errors import TrtpdError
    from trtpd.gateway.process import serve

    try:
        serve(args)
    except TrtpdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
