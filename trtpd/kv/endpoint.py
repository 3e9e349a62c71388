"""Where a prefill-side KV exporter listens, written into every handle.

    tcp://HOST:PORT            KV bytes travel on the TCP connection (crosses hosts)
    shm://HOST:PORT/SHM_NAME   control on TCP; KV bytes are copied out of /dev/shm/SHM_NAME (same host only)
    ucx://HOST:PORT            control on TCP; KV bytes on a UCX endpoint (ucxx), its port named in ACCEPT
    mpi://HOST:PORT            control on TCP; KV bytes on an MPI intercommunicator (Accept/Connect on a port
                               the exporter names on the control socket, one kept per pair of processes;
                               mpi_mover.py: the handshake and how a process joins MPI without mpiexec)
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpd.kv.errors import KvHandleMalformedError

TRANSPORTS = ("tcp", "shm", "ucx", "mpi")


@dataclass(frozen=True)
class KvEndpoint:
    transport: str
    host: str
    port: int
    shm_name: str | None = None

    def __str__(self) -> str:
        suffix = f"/{self.shm_name}" if self.transport == "shm" else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.transport}://{host}:{self.port}{suffix}"

    @classmethod
    def parse(cls, text: str) -> "KvEndpoint":
        transport, sep, rest = text.partition("://")
        address, _, shm_name = rest.partition("/")
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        if (not sep or transport not in TRANSPORTS or not host or not port.isdigit()
                or (transport == "shm") != bool(shm_name)):
            raise KvHandleMalformedError(
                f"KV endpoint {text!r} is not tcp://HOST:PORT (or ucx://, mpi://) or shm://HOST:PORT/SHM_NAME; "
                f"the handle was not made by a trtpd KV exporter")
        return cls(transport, host, int(port), shm_name or None)
