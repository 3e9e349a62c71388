"""Running the gateway in this process (`serve`, behind uvicorn). Starting and stopping it as a child
process of `trtpd up` is host-side fleet control: trtpd/fleet/gateway_process.py."""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from pathlib import Path

from trtpd.errors import TrtpdError


def _api_keys(path: str | None) -> frozenset[str]:
    if not path:
        return frozenset()
    keys = frozenset(line.strip() for line in Path(path).read_text().splitlines() if line.strip())
    if not keys:
        raise TrtpdError(f"{path}: no API key in it (one per line)")
    return keys


def serve(args) -> None:
    import uvicorn

    from trtpd.gateway.app import create_app
    from trtpd.gateway.config import from_fleet_file

    config = from_fleet_file(args.fleet_file, host=args.host, api_keys=_api_keys(args.api_key_file),
                        max_inflight=args.max_inflight, max_queued=args.max_queued, slo_ttft_s=args.slo_ttft_s,
                        slo_tpot_s=args.slo_tpot_s, wait_for_instance_s=args.wait_for_instance_s)
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only for sockets that say so,
    # and without it a keep-alive client waits ~40 ms per response (Nagle against delayed ACKs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((args.host, args.port))
    config = replace(config, port=sock.getsockname()[1])
    if args.port_file:
        tmp = Path(args.port_file).with_suffix(".tmp")
        tmp.write_text(str(config.port))
        os.replace(tmp, args.port_file)
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning", timeout_graceful_shutdown=3))
    server.run(sockets=[sock])
