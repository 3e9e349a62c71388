"""KV bytes over MPI (mpi4py on the mpich wheel), for the `mpi` transport; mover.py has the protocol.

Dynamic membership without one MPI world: each pull joins the two processes with MPI_Comm_join on the pull's
own (authenticated) TCP control socket, which is MPI's connect/accept with the port name exchanged on that
socket; the intercommunicator carries the hello and the layers, and is disconnected when the pull ends.

Launch recipe (MpiWorld): MPICH's dynamic-process calls fail between two plain singletons ("both contain
process 0"); each process must belong to an mpiexec of its own. A role model runs in a python-backend stub
that tritonserver starts, not mpiexec, so before MPI_Init the process starts `mpiexec -n 1 -pmi-port` around
a placeholder that prints the PMI_* variables hydra gave it and then waits on its stdin (it ends when this
process does); this process sets those variables for MPI_Init, which connects to that hydra proxy as its rank
0, and removes them again (a child process must not join that job as the same rank).
A process already under mpiexec (PMI_FD or PMI_PORT set) uses its own.

Limits: a process that loaded ucxx first (the ucx transport) gets MPICH's ofi netmod: both libraries are
libucp.so.0, ucxx's is 1.19 and MPICH's UCX netmod wants 1.20. MPICH's blocking calls spin, so the transport never blocks in MPI while idle (no standing Accept: a
blocked Accept costs a whole core); it polls requests with short sleeps while a pull moves bytes. A peer that
stops answering in the middle of the join (after the port names are exchanged) can hold the session's thread
there; a peer that dies during the layers is caught by the deadlines (requests are polled against them).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from trtpd.kv.mover import HELLO, unpack_block_ids, unpack_hello_head

TAG_HELLO, TAG_DATA = 1, 2
POLL_S = 0.0001
PMI_TIMEOUT_S = 30.0
PLACEHOLDER = ("import os, sys; print(repr({k: v for k, v in os.environ.items() if k.startswith(('PMI_', "
               "'MPI_LOCAL'))}), flush=True); sys.stdin.read()")


class MpiWorld:
    """MPI in this process: initialized once (MPI_THREAD_MULTIPLE), under a borrowed mpiexec if needed."""

    _instance: "MpiWorld | None" = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self.placeholder, borrowed = None, {}
        if not (os.environ.get("PMI_FD") or os.environ.get("PMI_PORT")):
            self.placeholder, borrowed = self._borrow_pmi()
        if "ucxx" in sys.modules:   # ucxx's libucp (1.19) is loaded: MPICH's UCX netmod needs >= 1.20, so use ofi
            os.environ.setdefault("MPIR_CVAR_CH4_NETMOD", "ofi")
        try:
            os.environ.update(borrowed)
            import mpi4py
            mpi4py.rc.finalize = False   # MPI_Finalize at exit crashed after joins (SIGSEGV); the OS cleans up
            from mpi4py import MPI
            MPI.Query_thread()      # (mpi4py initializes MPI on import)
        except ImportError:
            raise ConnectionError("the mpi KV transport needs mpi4py and the mpich wheel: install trtpd's "
                                  "dependencies (scripts/setup.sh), or use --kv-transport shm, tcp or ucx") from None
        finally:   # read by MPI_Init only; a child process must not join the placeholder's job as this rank
            for name in borrowed:
                os.environ.pop(name, None)
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise ConnectionError(f"MPI gave thread level {MPI.Query_thread()}, the mpi KV transport needs "
                                  f"MPI_THREAD_MULTIPLE")
        self.MPI = MPI

    @staticmethod
    def _borrow_pmi() -> tuple[subprocess.Popen, dict[str, str]]:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        if not mpiexec.is_file():
            raise ConnectionError(f"{mpiexec} not found: the mpi KV transport needs the mpich wheel's mpiexec next "
                                  f"to this Python (scripts/setup.sh installs it)")
        proc = subprocess.Popen([str(mpiexec), "-n", "1", "-pmi-port", sys.executable, "-c", PLACEHOLDER],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        line = proc.stdout.readline()   # (the placeholder prints at once; mpiexec failing closes stdout)
        try:
            env = eval(line, {"__builtins__": {}}) if line.startswith("{") else {}
        except SyntaxError:
            env = {}
        if "PMI_PORT" not in env:
            proc.kill()
            raise ConnectionError(f"`{mpiexec} -n 1 -pmi-port` gave no PMI_PORT ({line.strip()!r}); the mpi KV "
                                  f"transport cannot start MPI in this process")
        return proc, env

    @classmethod
    def get(cls) -> "MpiWorld":
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def wait(self, requests: list, timeout_s: float, what: str) -> None:
        """Polls the requests (driving MPI's progress) until all completed; TimeoutError past the deadline."""
        deadline_s = time.monotonic() + timeout_s
        try:
            while not self.MPI.Request.Testall(requests):
                if time.monotonic() >= deadline_s:
                    raise TimeoutError(f"MPI: {what} did not complete in {timeout_s:.3g} s")
                time.sleep(POLL_S)
        except self.MPI.Exception as e:
            raise ConnectionError(f"MPI: {what}: {e}") from None

    def join(self, sock: socket.socket):
        """MPI_Comm_join on the pull's control socket (blocking mode while it runs)."""
        timeout = sock.gettimeout()
        sock.settimeout(None)
        try:
            return self.MPI.Comm.Join(sock.fileno())
        except self.MPI.Exception as e:
            raise ConnectionError(f"MPI: Comm.Join failed: {e}") from None
        finally:
            sock.settimeout(timeout)


class MpiChannel:
    def __init__(self, world: MpiWorld, comm) -> None:
        self._world, self._comm = world, comm
        self._layers: list[list] = []

    def send(self, buffers: list[memoryview], timeout_s: float) -> None:
        requests = [self._comm.Isend(b, dest=0, tag=TAG_DATA) for b in buffers if len(b)]
        self._world.wait(requests, timeout_s, "sending KV segments")

    # MPI moves rendezvous messages only inside MPI calls, so a layer is sent to the end before the session
    # goes back to waiting for prefill: start_send completes its sends (the importer polls its receives).
    def start_send(self, buffers: list[memoryview], timeout_s: float = 30.0) -> None:
        self.send(buffers, timeout_s)

    def wait_sent(self, timeout_s: float) -> None:
        pass

    def start_recv(self, layers: list[list[memoryview]]) -> None:
        self._layers = [[self._comm.Irecv(b, source=0, tag=TAG_DATA) for b in buffers if len(b)]
                        for buffers in layers]

    def wait_received(self, layer: int, timeout_s: float) -> None:
        self._world.wait(self._layers[layer], timeout_s, f"receiving layer {layer}")

    def release(self) -> None:
        try:
            self._comm.Disconnect()    # both ends release after the ACK/CONFIRM: collective, and quick
        except self._world.MPI.Exception:
            pass

    def close(self) -> None:
        for request in (r for layer in self._layers for r in layer):
            try:
                request.Cancel()
            except self._world.MPI.Exception:
                pass
        try:
            self._comm.Free()          # local: never waits for a peer that may be gone
        except self._world.MPI.Exception:
            pass


class _PendingJoin:
    def __init__(self, world: MpiWorld, sock: socket.socket, token: bytes) -> None:
        self._world, self._sock, self._token = world, sock, token

    def wait(self, timeout_s: float) -> tuple[MpiChannel, list[int]]:
        channel = MpiChannel(self._world, self._world.join(self._sock))
        try:
            head = np.empty(HELLO.size, np.uint8)
            self._world.wait([channel._comm.Irecv(head, source=0, tag=TAG_HELLO)], timeout_s, "the hello")
            token, num_blocks = unpack_hello_head(head.tobytes())
            if token != self._token:
                raise ConnectionError("MPI: the hello's channel token does not match this pull")
            ids = np.empty(4 * num_blocks, np.uint8)
            if num_blocks:
                self._world.wait([channel._comm.Irecv(ids, source=0, tag=TAG_HELLO)], timeout_s, "the hello")
        except BaseException:
            channel.close()
            raise
        return channel, unpack_block_ids(ids.tobytes())


class MpiServer:
    address = b"join"

    def __init__(self) -> None:
        self._world = MpiWorld.get()

    def expect(self, token: bytes, sock: socket.socket) -> _PendingJoin:
        return _PendingJoin(self._world, sock, token)

    def forget(self, pending: _PendingJoin) -> None:
        pass

    def close(self) -> None:
        pass


class MpiClient:
    def __init__(self) -> None:
        self._world = MpiWorld.get()

    def connect(self, host: str, address: bytes, hello: bytes, timeout_s: float,
                sock: socket.socket | None = None) -> MpiChannel:
        if address != MpiServer.address or sock is None:
            raise ConnectionError(f"MPI: the exporter offers {address!r}, not a join on the control socket")
        channel = MpiChannel(self._world, self._world.join(sock))
        try:
            requests = [channel._comm.Isend(memoryview(hello[:HELLO.size]), dest=0, tag=TAG_HELLO)]
            if len(hello) > HELLO.size:
                requests.append(channel._comm.Isend(memoryview(hello[HELLO.size:]), dest=0, tag=TAG_HELLO))
            self._world.wait(requests, timeout_s, "sending the hello")
        except BaseException:
            channel.close()
            raise
        return channel

    def close(self) -> None:
        pass
