"""Connection limits for the gateway's HTTP server: no client, and no pile of sockets, can stall it.

uvicorn (pinned in pyproject.toml) gives a keep-alive timeout that starts only after a first response and a
`limit_concurrency` that answers 503 but keeps every connection open; it has no header or body read
timeout and no bound on open sockets (an idle or half-sent connection stays forever, and enough of them
exhaust the open-file limit). `GuardedH11Protocol` is uvicorn's h11 protocol with what is missing, the way
nginx does it:

* **a connection bound**: at `max_connections`, a new connection closes the longest-idle connection that
  has no request being served (idle keep-alive, never sent a byte, or still sending its headers: the app
  has not seen it); if every connection is serving a request, the new one gets 503 with Retry-After and
  is closed. The bound sits below the open-file limit with room for an accept burst (`raise_open_file_limit`
  raises the soft limit to the hard one at start; `connection_bound` sizes the bound from it), so accept()
  never fails for lack of descriptors;
* **timeouts**, checked once a second: idle between requests `keep_alive_timeout_s`; a request's headers and
  body must arrive within `request_read_timeout_s` of its first byte, the first request within that of the
  connection (408, then closed; a connection that sent nothing is just closed); a response the client does
  not read for `send_timeout_s` (the socket's buffers full) closes the connection;
* **small buffers per connection**: the kernel send buffer and the transport's write high-water mark are
  `stream_buffer_bytes`, so a client that stops reading holds at most that much of the gateway's memory
  (the app cancels the generation behind it: app.py's relay).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


ACCEPT_BACKLOG = 128   # also asyncio's accept burst: sockets accepted before any connection_made can evict
# the kernel's queue of connections not yet accepted (capped by net.core.somaxconn): with 128, a burst of 1,000
# connects overflowed it (TcpExt ListenOverflows ~490 a burst), SYN cookies stood in, and a cookie that failed to
# validate reset its connection (the burst test's httpx.ReadError: a client closed with no response)
LISTEN_BACKLOG = 4096
MAX_AUTO_CONNECTIONS = 4096


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = MAX_AUTO_CONNECTIONS
    keep_alive_timeout_s: float = 5.0
    request_read_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    stream_buffer_bytes: int = 64 * 1024


FILE_RESERVE = 256            # descriptors for the gateway's own files, channels to the instances, logs


def raise_open_file_limit() -> int:
    """Raises the soft open-file limit to the hard one; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_bound(asked: int | None, open_files: int) -> int:
    """The connection bound for an open-file limit: room is kept for one accept burst (asyncio accepts up to the
    backlog's worth of sockets before their protocols run, and the connections they evict close a loop turn
    later) and for the gateway's own files. `asked` None: as many as fit, at most MAX_AUTO_CONNECTIONS; a bound
    asked for that does not fit is refused (ValueError), never silently lowered."""
    room = open_files - 2 * ACCEPT_BACKLOG - FILE_RESERVE
    if asked is None:
        if room < 16:
            raise ValueError(f"an open-file limit of {open_files} leaves no room for connections; raise it (ulimit -n)")
        return min(MAX_AUTO_CONNECTIONS, room)
    if asked > room:
        raise ValueError(f"{asked} connections need an open-file limit of at least "
                         f"{asked + 2 * ACCEPT_BACKLOG + FILE_RESERVE}; this process may open {open_files} files "
                         f"(ulimit -n); lower the bound or raise the limit")
    return asked


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's `http=` protocol class with these limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class GuardedH11Protocol(H11Protocol):
    limits = ConnectionLimits()

    # ---- uvicorn's protocol interface ------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        now = time.monotonic()
        # a new connection is reading its first request: it has request_read_timeout_s to send it (the idle
        # keep-alive timeout starts after a response)
        self.idle_since: float | None = None       # since when no request (None: one is being read or served)
        self.request_started = now
        self.write_paused_since: float | None = None
        self._tune(transport)
        _Sweeper.for_loop(self.loop, self.limits).add(self)
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self._refuse()

    def connection_lost(self, exc: Exception | None) -> None:
        _Sweeper.for_loop(self.loop, self.limits).discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.idle_since is not None and self._between_requests():
            self.idle_since = None
            self.request_started = time.monotonic()
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._between_requests():
            self.idle_since = time.monotonic()

    def pause_writing(self) -> None:
        self.write_paused_since = time.monotonic()
        super().pause_writing()

    def resume_writing(self) -> None:
        self.write_paused_since = None
        super().resume_writing()

    # ---- states -----------------------------------------------------------------------------
    def _between_requests(self) -> bool:
        """No request is being served: none started, or the last one's response is complete."""
        return self.cycle is None or self.cycle.response_complete

    def evictable(self) -> bool:
        """Nothing of the app runs for it: idle, or still sending a request's headers."""
        return self._between_requests() and self.conn.their_state in (h11.IDLE, h11.DONE)

    def check(self, now: float) -> None:
        """Closes the connection if one of its timeouts ran out (the sweeper calls it once a second)."""
        if self.transport.is_closing():
            return
        limits = self.limits
        if self.write_paused_since is not None and now - self.write_paused_since > limits.send_timeout_s:
            log.info("closing a connection whose client read nothing for %.0f s", limits.send_timeout_s)
            self.transport.abort()
        elif self.idle_since is not None and now - self.idle_since > limits.keep_alive_timeout_s:
            self._close()
        elif self.idle_since is None and self._reading_request() and \
                now - self.request_started > limits.request_read_timeout_s:
            if self.cycle is None and not self.conn.trailing_data[0]:
                self._close()    # never sent a byte
            else:
                self._answer_and_close(408, b"the request did not arrive in time")

    def _reading_request(self) -> bool:
        if self._between_requests():
            return True    # headers not complete yet
        return self.cycle.more_body and not self.cycle.response_started

    # ---- actions -----------------------------------------------------------------------------
    def _make_room(self) -> bool:
        victim = _Sweeper.for_loop(self.loop, self.limits).oldest_evictable(exclude=self)
        if victim is None:
            return False
        victim._close()
        return True

    def _refuse(self) -> None:
        _Sweeper.for_loop(self.loop, self.limits).num_refused += 1
        self._answer_and_close(503, b"too many connections; retry later", retry_after=True)

    def _close(self) -> None:
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:
            pass
        self.transport.close()

    def _answer_and_close(self, status: int, text: bytes, retry_after: bool = False) -> None:
        """A complete plain-text response with Connection: close, when no response has started."""
        if self.cycle is not None and self.cycle.response_started:
            self.transport.abort()
            return
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                   (b"content-length", str(len(text)).encode())]
        if retry_after:
            headers.append((b"retry-after", b"1"))
        reason = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        head = b"HTTP/1.1 %d %s\r\n" % (status, reason) + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
        self.transport.write(head + b"\r\n" + text)
        if self.cycle is not None:
            self.cycle.disconnected = True   # the app (if it runs) must not write after this answer
        self.transport.close()

    def _tune(self, transport: asyncio.Transport) -> None:
        size = self.limits.stream_buffer_bytes
        transport.set_write_buffer_limits(high=size)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
            except OSError:
                pass


class _Sweeper:
    """The connections of one event loop, oldest idle first, checked once a second."""

    _by_loop: dict[int, "_Sweeper"] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: ConnectionLimits) -> None:
        self.loop = loop
        self.limits = limits
        self.connections: set[GuardedH11Protocol] = set()
        self.num_refused = 0
        self.handle = loop.call_later(1.0, self._tick)

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop, limits: ConnectionLimits) -> "_Sweeper":
        sweeper = cls._by_loop.get(id(loop))
        if sweeper is None or sweeper.loop is not loop:
            sweeper = cls._by_loop[id(loop)] = cls(loop, limits)
        return sweeper

    def add(self, conn: GuardedH11Protocol) -> None:
        self.connections.add(conn)

    def discard(self, conn: GuardedH11Protocol) -> None:
        self.connections.discard(conn)

    def oldest_evictable(self, exclude: GuardedH11Protocol) -> GuardedH11Protocol | None:
        candidates = [c for c in self.connections if c is not exclude and not c.transport.is_closing()
                      and c.evictable()]
        # idle ones first (longest idle first), then those still sending headers (oldest first)
        return min(candidates, key=lambda c: (c.idle_since is None, c.idle_since or c.request_started),
                   default=None)

    def _tick(self) -> None:
        now = time.monotonic()
        for conn in list(self.connections):
            try:
                conn.check(now)
            except Exception:   # noqa: BLE001 - one broken connection must not stop the checks of the others
                log.exception("checking a connection failed")
        self.handle = self.loop.call_later(1.0, self._tick)
