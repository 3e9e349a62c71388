"""`trtpd up`: render the reference repository and start the real tritonserver on 127.0.0.1."""

from __future__ import annotations

import argparse

from trtpd.cli import args as a
from trtpd.cli.common import add_reference_args, reference_spec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start a deployment (tritonserver with the rendered repository)",
                       description="Render the model repository for the reference backend and start tritonserver "
                                   "on 127.0.0.1; waits until it is ready and prints its endpoints.")
    p.add_argument("--name", default="default", help="deployment name (default: %(default)s)")
    p.add_argument("--http-port", type=a.port, help="(default: a free port)")
    p.add_argument("--grpc-port", type=a.port, help="(default: a free port)")
    p.add_argument("--metrics-port", type=a.port, help="(default: a free port)")
    p.add_argument("--replace", action="store_true", help="stop a running deployment of the same name first")
    add_reference_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtpd.serving import deployment
    from trtpd.serving.tritonserver import ServerPorts

    spec = reference_spec(args)
    ports = None
    if args.http_port or args.grpc_port or args.metrics_port:
        picked = ServerPorts.pick()
        ports = ServerPorts(args.http_port or picked.http, args.grpc_port or picked.grpc,
                            args.metrics_port or picked.metrics)
    print(f"starting {args.mode} deployment {args.name!r} ...", flush=True)
    dep = deployment.up(args.name, spec, ports=ports, replace=args.replace)
    s = dep.server
    print(f"ready: {args.name} ({dep.mode}), pid {s.pid}")
    print(f"  HTTP     http://{s.http_url}   (POST /v2/models/ensemble/generate | generate_stream)")
    print(f"  gRPC     {s.grpc_url}")
    print(f"  metrics  {s.metrics_url}")
    print(f"  log      {s.log_path}")
    return 0
