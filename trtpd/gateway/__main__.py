"""`python -m trtpd.gateway --fleet-file FLEET.json --api-key-file KEYS`: the gateway for a running fleet
(uvicorn on 127.0.0.1). `trtpd up --fleet` starts it; run it by hand to put a second gateway in front of the
same fleet."""

from __future__ import annotations

import argparse
import sys

from trtpd.gateway.connections import ConnectionLimits
from trtpd.schema.slo import Slo

LIMITS = ConnectionLimits()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtpd.gateway", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fleet-file", required=True,
                   help="the fleet's record: <TRTPD_HOME>/deployments/<name>/fleet.json")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=0, help="port (0: a free one, written to the port file)")
    p.add_argument("--state-file", help="write {pid, start_time, host, port} here (JSON) once listening")
    auth = p.add_mutually_exclusive_group()
    auth.add_argument("--api-key-file", help="file with one API key per line, mode 0600 (required unless --no-auth)")
    auth.add_argument("--no-auth", action="store_true", help="serve the API without a key (loopback --host only)")
    p.add_argument("--max-inflight", type=int, default=64, help="requests served at once")
    p.add_argument("--max-queued", type=int, default=256, help="waiting requests beyond which clients get 429")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413")
    p.add_argument("--max-connections", type=int, default=None,
                   help="open connections; beyond, the longest-idle one is closed, or the new one gets 503 (default: "
                        f"as many as the open-file limit holds, at most {LIMITS.max_connections})")
    p.add_argument("--keep-alive-timeout-s", type=float, default=LIMITS.keep_alive_timeout_s,
                   help="a connection idle between requests is closed after this")
    p.add_argument("--request-read-timeout-s", type=float, default=LIMITS.request_read_timeout_s,
                   help="a request's headers and body must arrive within this of its first byte, a new connection's "
                        "first request within this of the connection (408)")
    p.add_argument("--send-timeout-s", type=float, default=LIMITS.send_timeout_s,
                   help="a client that reads nothing of its response for this long is disconnected")
    p.add_argument("--max-buffered-chunks", type=int, default=256,
                   help="per stream: chunks generated ahead of a client that does not read; beyond, it is cancelled")
    p.add_argument("--stream-buffer-bytes", type=int, default=LIMITS.stream_buffer_bytes,
                   help="per connection: the socket send buffer and the write buffer before the client must read")
    p.add_argument("--slo-ttft-s", type=float, default=Slo().ttft_s,
                   help="TTFT target for live goodput (default: trtpd's SLO default, %(default)s)")
    p.add_argument("--slo-tpot-s", type=float, default=Slo().tpot_s,
                   help="TPOT target for live goodput (default: trtpd's SLO default, %(default)s)")
    p.add_argument("--wait-for-instance-s", type=float, default=15.0,
                   help="a request that finds no ready instance of a role it needs waits this long for one (a "
                        "replacement being started by the controller) before it gets 503; 0 for a fleet that no "
                        "controller heals")
    args = p.parse_args(argv)

    from trtpd.errors import TrtpdError
    from trtpd.gateway.serve import serve

    try:
        serve(args)
    except TrtpdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
