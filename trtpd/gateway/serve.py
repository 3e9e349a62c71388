"""Running the gateway in this process (`serve`, behind uvicorn). Starting and stopping it as a child
process of `trtpd up` is host-side fleet control: trtpd/fleet/gateway_process.py."""

from __future__ import annotations

import logging
import socket
from dataclasses import replace

from trtpd.errors import ConfigError
from trtpd.process_identity import write_state_file
from trtpd.schema.slo import Slo


def serve(args) -> None:
    import uvicorn

    from trtpd import log_limits
    from trtpd.gateway.api_keys import check_no_auth, read_api_keys
    from trtpd.gateway.app import create_app
    from trtpd.gateway.config import from_fleet_file
    from trtpd.gateway.connections import (ACCEPT_BACKLOG, LISTEN_BACKLOG, ConnectionLimits, connection_bound,
                                          guarded_protocol, raise_open_file_limit)

    log_limits.configure()
    logging.getLogger("httpx").setLevel(logging.WARNING)   # the trtllm-serve transport's probes: one line each
    if args.no_auth:
        check_no_auth(args.host)
        keys = frozenset()
    elif args.api_key_file:
        keys = read_api_keys(args.api_key_file)
    else:
        raise ConfigError("the gateway needs an API key: pass --api-key-file FILE (one key per line, mode 0600; "
                          "`trtpd up` makes one) or --no-auth (loopback addresses only)")
    try:
        max_connections = connection_bound(args.max_connections, raise_open_file_limit())
    except ValueError as exc:
        raise ConfigError(f"--max-connections: {exc}") from None
    limits = ConnectionLimits(max_connections=max_connections, keep_alive_timeout_s=args.keep_alive_timeout_s,
                              request_read_timeout_s=args.request_read_timeout_s, send_timeout_s=args.send_timeout_s,
                              stream_buffer_bytes=args.stream_buffer_bytes)
    config = from_fleet_file(args.fleet_file, host=args.host, api_keys=keys,
                             max_inflight=args.max_inflight, max_queued=args.max_queued,
                             slo=Slo(ttft_s=args.slo_ttft_s, tpot_s=args.slo_tpot_s),
                             wait_for_instance_s=args.wait_for_instance_s,
                             max_body_bytes=args.max_body_bytes, max_buffered_chunks=args.max_buffered_chunks)
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only for sockets that say so,
    # and without it a keep-alive client waits ~40 ms per response (Nagle against delayed ACKs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((args.host, args.port))
    config = replace(config, port=sock.getsockname()[1])
    if args.state_file:
        write_state_file(args.state_file, args.host, config.port)
    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            # asyncio listens with `backlog`, which is also its accept burst (fd room: connections.py); the
            # kernel's queue may be longer without accepting more sockets at once
            for listening in sockets or ():
                listening.listen(LISTEN_BACKLOG)

    server = Server(uvicorn.Config(
        create_app(config), log_level="warning", timeout_graceful_shutdown=3, http=guarded_protocol(limits),
        timeout_keep_alive=int(max(1, limits.keep_alive_timeout_s)), backlog=ACCEPT_BACKLOG,
        log_config=None))
    server.run(sockets=[sock])
