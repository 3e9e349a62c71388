"""Ports a deployment will listen on: distinct, in range, and (optionally) free on this host."""

from __future__ import annotations

import socket
from collections.abc import Mapping

from trtpd.lint.findings import Finding


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def lint_ports(ports: Mapping[str, int], *, host: str = "127.0.0.1", check_free: bool = True) -> list[Finding]:
    findings, owner = [], {}
    for name, port in ports.items():
        if not 1 <= port <= 65535:
            findings.append(Finding("ports", "error", name, f"port {port} is out of range", "use 1-65535"))
            continue
        if port in owner:
            findings.append(Finding("ports", "error", name, f"port {port} is also used by {owner[port]}",
                                    "give every endpoint its own port"))
            continue
        owner[port] = name
        if check_free and not port_is_free(port, host):
            findings.append(Finding("ports", "error", name, f"port {port} is already in use on {host}",
                                    "stop what listens there or choose another port"))
    return findings
