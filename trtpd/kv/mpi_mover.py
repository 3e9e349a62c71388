"""KV bytes over MPI (mpi4py on the mpich wheel), for the `mpi` transport; mover.py has the protocol.

Dynamic membership without one MPI world: two processes connect with MPI_Comm_accept / MPI_Comm_connect,
the port name passing on the pull's own (authenticated) TCP control socket, and keep that intercommunicator
(a Link) for the next pulls between them; each pull has a tag of its own on it, which carries its hello and
its layers. After ACCEPT, on the control socket (the ACCEPT's mover address names the exporter's process):

    importer -> exporter  importer process id (16) | pull tag (u32) | mode (u8: 0 reuse our link, 1 handshake)
    exporter -> importer  status (u8): 0 reuse, 1 no such link (the importer then asks again with mode 1),
                          2 port name follows (u16 length | name), then MPI_Comm_accept / MPI_Comm_connect

Why not one MPI_Comm_join per pull, as before: MPICH 5 matches the messages of its connection handshake by
(context 0, the port's tag) only, from any source, and port tags are small integers counted per process, so two
handshakes in flight in one process (concurrent pulls: the session threads of an exporter, the pull threads of
an importer) take each other's messages. The integration run's SIGSEGV in about 1 run of 3 (issue 12) was that:
the core shows the crashing thread in MPI_Comm_join, in MPICH's extract_remote_data, indexing its on-stack world
table with a world index read from another handshake's leader-exchange message. MPI_Comm_join also spins forever
on a control socket that its peer closed before sending its port name (MPICH's join loop reads 0 bytes again
and again), holding the VCI lock every other MPI call of the process needs. So here:
  * every MPI call of the process is made under one lock (MpiWorld.calls), and at most one handshake is in
    flight per process (MpiWorld.handshakes); the importer takes its handshake lock before it asks for one and
    the exporter takes its own only once asked, so an exporter holding it always has its peer already waiting
    (no cycle of processes waiting for each other's lock, given that a process only exports or only imports);
  * handshakes are rare: a link is reused by every later pull between the same two processes, and retired
    (freed once its pulls ended) only when a pull on it failed;
  * a pull's tag is drawn from a per-process counter (random start, 1 .. MPI_TAG_UB), never reused for
    ~5e8 pulls, so bytes of a failed pull that arrive late match no later pull, even on a reused context id;
  * MPICH's handshake timeouts (info "timeout") bound a peer that died mid-handshake; a timed-out accept leaves
    a receive posted on its port's tag, so that port is never closed (its tag is never handed out again).

Launch recipe (MpiWorld): MPICH's dynamic-process calls fail between two plain singletons ("both contain
process 0"); each process must belong to an mpiexec of its own. A role model runs in a python-backend stub
that tritonserver starts, not mpiexec, so before MPI_Init the process starts `mpiexec -n 1 -pmi-port` around
a placeholder that prints the PMI_* variables hydra gave it and then waits on its stdin (it ends when this
process does); this process sets those variables for MPI_Init, which connects to that hydra proxy as its rank
0, and removes them again (a child process must not join that job as the same rank).
A process already under mpiexec (PMI_FD or PMI_PORT set) uses its own.

/dev/shm: MPICH creates its node segment /dev/shm/mpich_shm_<world>_<node> at MPI_Init and unlinks it only in
MPI_Finalize. Every world here has one process, so nothing else ever opens it by name: the process unlinks the
segments it maps right after MPI_Init (the mapping stays), and a killed process leaves nothing behind.
MPI_Finalize is not called (mpi4py.rc.finalize = False): it is collective over connected processes, and peers
here come and go.

Limits: a process that loaded ucxx first (the ucx transport) gets MPICH's ofi netmod: both libraries are
libucp.so.0, ucxx's is 1.19 and MPICH's UCX netmod wants 1.20. ofi is then given libfabric's tcp provider (MPICH's
choice here, 'sockets', delivers nothing on these intercommunicators). A ucx process and an ofi process cannot
connect: the ACCEPT's address names the exporter's netmod and the importer refuses a different one at once.
MPICH's blocking calls spin, so the transport never blocks in MPI while idle (no standing Accept: a blocked
Accept costs a whole core); it polls requests with short sleeps while a pull moves bytes, and watches the
control socket meanwhile (a peer that closed it is gone: the wait fails at once instead of at the deadline).
A peer that dies inside the MPI part of a handshake holds this process's handshake (and MPI) lock until
MPICH's handshake timeout. A link to a process that is gone stays (a communicator and a few bytes) for the
life of this process.
"""

from __future__ import annotations

import math
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from trtpd.kv.errors import KvProtocolError
from trtpd.kv.frame import peer_gone, recv_exact
from trtpd.kv.mover import HELLO, unpack_block_ids, unpack_hello_head

POLL_S = 0.0001
PEER_CHECK_S = 0.01           # how often a wait looks at the control socket
CANCEL_WAIT_S = 1.0           # a failed pull waits this long for its cancelled receives to complete
PMI_TIMEOUT_S = 30.0
ID_BYTES = 16
ADDRESS_PREFIX = b"mpi/"                # ACCEPT's mover address: mpi/<process id hex>/<netmod>
DEFAULT_NETMOD = "ucx"                  # the mpich wheel's default (MPIR_CVAR_CH4_NETMOD unset)
REQUEST = struct.Struct("!16sIB")       # importer process id, pull tag, mode
MODE_REUSE, MODE_HANDSHAKE = 0, 1
STATUS_REUSE, STATUS_NO_LINK, STATUS_PORT = 0, 1, 2
REQUESTS_MAX = 3             # link requests per pull: the last one asks for a handshake
PLACEHOLDER = ("import os, sys; print(repr({k: v for k, v in os.environ.items() if k.startswith(('PMI_', "
               "'MPI_LOCAL'))}), flush=True); sys.stdin.read()")


def unlink_own_shm() -> list[str]:
    """Unlinks the MPICH segments in /dev/shm that this process maps (see the module's docstring)."""
    removed = []
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps if line.count(" ") >= 5 and "/dev/shm/" in line}
    except OSError:
        return removed
    for path in sorted(paths):
        if path.startswith("/dev/shm/mpich_") and not path.endswith("(deleted)"):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


class Link:
    """An intercommunicator to one other process, shared by the pulls between the two."""

    def __init__(self, comm, peer_id: bytes) -> None:
        self.comm, self.peer_id = comm, peer_id
        self.num_pulls = 0            # pulls using it now
        self.is_retired = False       # a pull on it failed: no new pull takes it; freed after the last one


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
        self.netmod = os.environ.get("MPIR_CVAR_CH4_NETMOD") or DEFAULT_NETMOD
        if self.netmod == "ofi":    # MPICH picks libfabric's 'sockets' provider here, over which an intercommunicator
            os.environ.setdefault("FI_PROVIDER", "tcp")      # of accept/connect (or join) delivers no message
        try:
            os.environ.update(borrowed)
            import mpi4py
            mpi4py.rc.finalize = False   # collective over connected processes (see above)
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
        unlink_own_shm()
        self.id = os.urandom(ID_BYTES)
        self.calls = threading.Lock()          # every MPI call of the process
        self.handshakes = threading.Lock()     # at most one connection handshake in flight
        self._links: dict[bytes, Link] = {}
        self._links_lock = threading.Lock()
        self._tag_ub = int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))
        self._next_tag = random.randrange(1, self._tag_ub)
        self.num_handshakes = 0

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

    @property
    def address(self) -> bytes:
        return ADDRESS_PREFIX + self.id.hex().encode() + b"/" + self.netmod.encode()

    def call(self, what: str, fn, *args):
        """One MPI call, under the process's MPI lock; MPI errors become ConnectionError."""
        try:
            with self.calls:
                return fn(*args)
        except self.MPI.Exception as e:
            raise ConnectionError(f"MPI: {what}: {e}") from None

    def new_tag(self) -> int:
        with self._links_lock:
            tag = self._next_tag
            self._next_tag = tag % (self._tag_ub - 1) + 1
            return tag

    def wait(self, requests: list, timeout_s: float, what: str, sock: socket.socket | None = None) -> None:
        """Polls the requests (driving MPI's progress) until all completed; TimeoutError past the deadline,
        ConnectionError if MPI fails or the peer closed the control socket `sock`."""
        deadline_s = time.monotonic() + timeout_s
        next_check_s = time.monotonic() + PEER_CHECK_S
        while not self.call(what, self.MPI.Request.Testall, requests):
            now_s = time.monotonic()
            if now_s >= deadline_s:
                raise TimeoutError(f"MPI: {what} did not complete in {timeout_s:.3g} s")
            if now_s >= next_check_s:
                why = peer_gone(sock)
                if why:
                    raise ConnectionError(f"MPI: {what}: {why}")
                next_check_s = now_s + PEER_CHECK_S
            time.sleep(POLL_S)

    def cancel(self, requests: list) -> None:
        """Cancels requests and waits (briefly) until they completed, so MPI no longer writes into their buffers."""
        active = [r for r in requests if r]
        for request in active:
            try:
                self.call("cancelling", request.Cancel)
            except ConnectionError:
                pass
        try:
            self.wait(active, CANCEL_WAIT_S, "cancelled receives")
        except (TimeoutError, ConnectionError):
            _ABANDONED.extend(active)    # (a receive MPI still owns: its buffer stays referenced)

    # links

    def take_link(self, peer_id: bytes) -> Link | None:
        with self._links_lock:
            link = self._links.get(peer_id)
            if link is None or link.is_retired:
                return None
            link.num_pulls += 1
            return link

    def add_link(self, peer_id: bytes, comm) -> Link:
        link = Link(comm, peer_id)
        link.num_pulls = 1
        with self._links_lock:
            old = self._links.get(peer_id)
            self._links[peer_id] = link
        if old is not None:
            self.end_pull(old, is_ok=False, take=False)
        return link

    def end_pull(self, link: Link, is_ok: bool, take: bool = True) -> None:
        """A pull on `link` ended; one that failed retires the link (freed when its last pull ends)."""
        with self._links_lock:
            if take:
                link.num_pulls -= 1
            if not is_ok:
                link.is_retired = True
                if self._links.get(link.peer_id) is link:
                    del self._links[link.peer_id]
            free = link.is_retired and link.num_pulls == 0 and link.comm is not None
            comm, link.comm = (link.comm, None) if free else (None, link.comm)
        if comm is not None:
            try:
                self.call("freeing a link", comm.Free)     # local: never waits for a peer that may be gone
            except ConnectionError:
                pass

    def handshake(self, timeout_s: float) -> "_Handshake":
        return _Handshake(self, timeout_s)

    def accept(self, sock: socket.socket, peer_id: bytes, timeout_s: float) -> Link:
        """The exporter's side of a handshake (its handshake lock held): port name on `sock`, then accept."""
        port = self.call("opening a port", self.MPI.Open_port)
        name = port.encode()
        sock.sendall(struct.pack("!BH", STATUS_PORT, len(name)) + name)
        info = self._timeout_info(timeout_s)
        try:    # (if this fails, MPICH may have left a receive posted on the port's tag: the port stays open,
                # so that no later port gets its tag)
            comm = self.call("accepting the importer", self.MPI.COMM_SELF.Accept, port, info, 0)
        finally:
            self.call("freeing an info", info.Free)
        self.call("closing a port", self.MPI.Close_port, port)
        self.num_handshakes += 1
        return self.add_link(peer_id, comm)

    def connect(self, sock: socket.socket, peer_id: bytes, timeout_s: float) -> Link:
        """The importer's side of a handshake (its handshake lock held): reads the port name, then connects."""
        deadline_s = time.monotonic() + timeout_s
        status = self._recv(sock, 1, deadline_s)[0]
        if status != STATUS_PORT:
            raise KvProtocolError(f"the exporter answered a handshake request with status {status}")
        (length,) = struct.unpack("!H", self._recv(sock, 2, deadline_s))
        port = self._recv(sock, length, deadline_s).decode(errors="replace")
        info = self._timeout_info(deadline_s - time.monotonic())
        try:
            comm = self.call("connecting to the exporter", self.MPI.COMM_SELF.Connect, port, info, 0)
        finally:
            self.call("freeing an info", info.Free)
        self.num_handshakes += 1
        return self.add_link(peer_id, comm)

    def _timeout_info(self, timeout_s: float):
        info = self.call("creating an info", self.MPI.Info.Create)
        self.call("setting an info", info.Set, "timeout", str(max(1, math.ceil(timeout_s))))
        return info

    @staticmethod
    def _recv(sock: socket.socket, num_bytes: int, deadline_s: float) -> bytes:
        sock.settimeout(max(deadline_s - time.monotonic(), 0.001))
        return recv_exact(sock, num_bytes)


_ABANDONED: list = []     # requests that would not complete after a cancel (kept, with their buffers)


class _Handshake:
    """The process's handshake lock, taken within a deadline."""

    def __init__(self, world: MpiWorld, timeout_s: float) -> None:
        self._world, self._timeout_s = world, timeout_s

    def __enter__(self) -> None:
        if not self._world.handshakes.acquire(timeout=max(self._timeout_s, 0.001)):
            raise TimeoutError(f"MPI: another connection handshake of this process took more than "
                               f"{self._timeout_s:.3g} s")

    def __exit__(self, *exc) -> None:
        self._world.handshakes.release()


class MpiChannel:
    def __init__(self, world: MpiWorld, link: Link, tag: int, sock: socket.socket | None) -> None:
        self._world, self._link, self._tag, self._sock = world, link, tag, sock
        self._comm = link.comm
        self._layers: list[list] = []
        self._is_ended = False

    def isend(self, buffer) -> object:
        return self._world.call("posting a send", self._comm.Isend, buffer, 0, self._tag)

    def irecv(self, buffer) -> object:
        return self._world.call("posting a receive", self._comm.Irecv, buffer, 0, self._tag)

    def send(self, buffers: list[memoryview], timeout_s: float) -> None:
        requests = [self.isend(b) for b in buffers if len(b)]
        self._world.wait(requests, timeout_s, "sending KV segments", self._sock)

    # MPI moves rendezvous messages only inside MPI calls, so a layer is sent to the end before the session
    # goes back to waiting for prefill: start_send completes its sends (the importer polls its receives).
    def start_send(self, buffers: list[memoryview], timeout_s: float = 30.0) -> None:
        self.send(buffers, timeout_s)

    def wait_sent(self, timeout_s: float) -> None:
        pass

    def start_recv(self, layers: list[list[memoryview]]) -> None:
        self._layers = [[self.irecv(b) for b in buffers if len(b)] for buffers in layers]

    def wait_received(self, layer: int, timeout_s: float) -> None:
        self._world.wait(self._layers[layer], timeout_s, f"receiving layer {layer}", self._sock)

    def release(self) -> None:
        """The pull completed: every message of its tag matched; the link stays for the next pull."""
        if not self._is_ended:
            self._is_ended = True
            self._world.end_pull(self._link, is_ok=True)

    def close(self) -> None:
        """The pull failed: its receives are cancelled and the link retired (a new pull makes a new one)."""
        if not self._is_ended:
            self._is_ended = True
            self._world.cancel([r for layer in self._layers for r in layer])
            self._world.end_pull(self._link, is_ok=False)


class _PendingJoin:
    def __init__(self, world: MpiWorld, sock: socket.socket, token: bytes) -> None:
        self._world, self._sock, self._token = world, sock, token

    def wait(self, timeout_s: float) -> tuple[MpiChannel, list[int]]:
        world, sock = self._world, self._sock
        deadline_s = time.monotonic() + timeout_s
        link = None
        try:
            for _ in range(REQUESTS_MAX):
                peer_id, tag, mode = REQUEST.unpack(world._recv(sock, REQUEST.size, deadline_s))
                if mode == MODE_HANDSHAKE:
                    with world.handshake(deadline_s - time.monotonic()):
                        link = world.accept(sock, peer_id, deadline_s - time.monotonic())
                    break
                if mode != MODE_REUSE:
                    raise KvProtocolError(f"the importer sent MPI link request mode {mode}")
                link = world.take_link(peer_id)
                if link is None:     # a handshake with that process may be finishing (its importer end is done)
                    with world.handshake(deadline_s - time.monotonic()):
                        link = world.take_link(peer_id)
                if link is not None:
                    sock.sendall(bytes([STATUS_REUSE]))
                    break
                sock.sendall(bytes([STATUS_NO_LINK]))   # this side retired (or never had) that link
            else:
                raise KvProtocolError(f"the importer sent {REQUESTS_MAX} MPI link requests without a handshake")
        except BaseException:
            if link is not None:
                world.end_pull(link, is_ok=False)
            raise
        channel = MpiChannel(world, link, tag, sock)
        try:
            head = np.empty(HELLO.size, np.uint8)
            world.wait([channel.irecv(head)], deadline_s - time.monotonic(), "the hello", sock)
            token, num_blocks = unpack_hello_head(head.tobytes())
            if token != self._token:
                raise ConnectionError("MPI: the hello's channel token does not match this pull")
            ids = np.empty(4 * num_blocks, np.uint8)
            if num_blocks:
                world.wait([channel.irecv(ids)], deadline_s - time.monotonic(), "the hello", sock)
        except BaseException:
            channel.close()
            raise
        return channel, unpack_block_ids(ids.tobytes())


class MpiServer:
    def __init__(self) -> None:
        self._world = MpiWorld.get()
        self.address = self._world.address

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
        if not address.startswith(ADDRESS_PREFIX) or sock is None:
            raise ConnectionError(f"MPI: the exporter offers {address!r}, not an MPI link on the control socket")
        id_hex, _, netmod = address[len(ADDRESS_PREFIX):].decode(errors="replace").partition("/")
        try:
            peer_id = bytes.fromhex(id_hex)
        except ValueError:
            peer_id = b""
        if len(peer_id) != ID_BYTES or not netmod:
            raise KvProtocolError(f"MPI: malformed exporter address {address!r}")
        world = self._world
        if netmod != world.netmod:
            raise ConnectionError(
                f"MPI: the exporter's MPICH uses its {netmod} netmod and this process {world.netmod} (a process that "
                f"loaded ucxx gets ofi); the two cannot connect: keep the ucx transport out of processes that use "
                f"mpi, or set MPIR_CVAR_CH4_NETMOD=ofi for both")
        deadline_s = time.monotonic() + timeout_s
        tag = world.new_tag()
        for attempt in range(REQUESTS_MAX):      # (the last request is a handshake)
            link = world.take_link(peer_id) if attempt < REQUESTS_MAX - 1 else None
            if link is None:
                with world.handshake(deadline_s - time.monotonic()):
                    link = world.take_link(peer_id) if attempt < REQUESTS_MAX - 1 else None   # made meanwhile?
                    if link is None:
                        sock.sendall(REQUEST.pack(world.id, tag, MODE_HANDSHAKE))
                        link = world.connect(sock, peer_id, deadline_s - time.monotonic())
                        break
            try:
                sock.sendall(REQUEST.pack(world.id, tag, MODE_REUSE))
                status = world._recv(sock, 1, deadline_s)[0]
            except BaseException:
                world.end_pull(link, is_ok=False)
                raise
            if status == STATUS_REUSE:
                break
            world.end_pull(link, is_ok=False)          # the exporter dropped its end: retire ours, ask again
            if status != STATUS_NO_LINK:
                raise KvProtocolError(f"the exporter answered a link request with status {status}")
        channel = MpiChannel(world, link, tag, sock)
        try:
            channel.send([memoryview(hello[:HELLO.size]), memoryview(hello[HELLO.size:])],
                         deadline_s - time.monotonic())
        except BaseException:
            channel.close()
            raise
        return channel

    def close(self) -> None:
        pass
