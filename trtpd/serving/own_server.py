"""Where a python model reaches the tritonserver it runs in: that server's gRPC endpoint, read from the server's
own command line (the stub is the server's child: /proc/<parent>/cmdline). Triton's defaults when a flag is
absent: --grpc-port 8001 and --grpc-address 0.0.0.0 (triton-inference-server/server src/grpc/grpc_server.h,
SocketOptions), gRPC on unless --allow-grpc=false. A server listening on every address is reached on 127.0.0.1."""

from __future__ import annotations

import os

DEFAULT_GRPC_PORT = 8001
ANY_ADDRESS = ("0.0.0.0", "::", "[::]", "")


class OwnServerError(Exception):
    pass


def flag_values(argv: list[str]) -> dict[str, str]:
    """`--name=value` and `--name value` pairs of a command line (the last one wins, as in Triton's parser)."""
    values: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                continue
            value = argv[i + 1]
        values[name] = value
    return values


def grpc_url_from_argv(argv: list[str]) -> str:
    flags = flag_values(argv)
    if flags.get("allow-grpc", "true").lower() in ("false", "0", "no", "off"):
        raise OwnServerError("tritonserver runs with --allow-grpc=false; the ensemble's disagg_bls reaches its role "
                             "models over this server's gRPC endpoint: start it with gRPC on (the default)")
    address = flags.get("grpc-address", "0.0.0.0")
    host = "127.0.0.1" if address in ANY_ADDRESS else address
    try:
        port = int(flags.get("grpc-port", DEFAULT_GRPC_PORT))
    except ValueError:
        raise OwnServerError(f"tritonserver's --grpc-port is {flags['grpc-port']!r}, not a port") from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def own_grpc_url(server_pid: int | None = None) -> str:
    """The gRPC address, host:port, of the tritonserver `server_pid` (default: this stub's parent, its server)."""
    pid = os.getppid() if server_pid is None else server_pid
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError as exc:
        raise OwnServerError(f"cannot read the command line of tritonserver (pid {pid}): {exc}") from None
    return grpc_url_from_argv(argv[1:])
