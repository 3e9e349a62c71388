"""The prefill side's table of exports: requests whose KV blocks wait to be pulled. Thread-safe, no I/O.

An export is registered when its prefill batch is scheduled, gains ready layers one by one, completes when
the first token is known, is attached to at most one pull, is acknowledged by that pull, and is released:
its request id goes to `released_ids` for the engine to free the blocks. It is also released when prefill
fails, when the request ended at its first token (discard: there is nothing to decode), when its deadline passes
without an acknowledged pull (the reaper), when its pull breaks, or when the decode side gives it up (its request
was cancelled or failed before the pull: give_up).
While a pull is attached, only the session serving it releases the export (the session may still be reading
the blocks); failing or timing out such an export sets `abort`, which the session sends to the decode side.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from trtpd.kv.frame import ErrorCode

NUM_RECENT_RELEASED = 4096   # remembered so that a late pull learns why its export is gone
NUM_ABANDONED = 4096         # requests given up before they were exported, remembered ...
ABANDONED_FOR_S = 120.0      # ... this long, so that a prefill scheduled after the give-up exports nothing


PEER_POLL_S = 0.2            # how often a session waiting on prefill checks that its puller is still there
PeerCheck = Callable[[], str | None]   # says why the pulling side is gone, or None while it is there


class PeerGone(ConnectionError):
    """The pulling side hung up while its session waited for layers or the first token: a broken pull."""


class ExportAbandoned(ValueError):
    """The request was given up (its client is gone) before its prefill was scheduled: nothing is exported."""


class Abort(Exception):
    """Why an export stops being served; the session sends it to the importer as an ERROR frame."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Export:
    request_id: str
    block_ids: list[int]
    num_tokens: int
    timeout_s: float
    deadline_s: float                 # time.monotonic()
    registered_at_s: float = 0.0      # time.time(); handles issued before it belong to an earlier export of the id
    num_layers_ready: int = 0
    first_token: int | None = None
    is_attached: bool = False
    is_acked: bool = False
    abort: Abort | None = None


@dataclass
class ExportCounters:
    bytes_sent: int = 0               # KV bytes of acknowledged pulls (exactly layout.bytes_for per pull)
    num_pulls: int = 0                # acknowledged pulls
    num_timeouts: int = 0
    num_failed: int = 0               # fail() by the engine
    num_broken_pulls: int = 0         # pulls that ended without an ACK (connection lost, protocol error)
    num_refused: int = 0              # pulls refused: bad handle, unknown request, busy
    num_given_up: int = 0             # released because the decode side said it will never pull them
    num_abandoned: int = 0            # never exported: given up (by request) before prefill was scheduled
    num_discarded: int = 0            # released by the engine: the request ended at its first token (discard)


@dataclass
class ExportTable:
    num_layers: int
    on_release: Callable[[], None] | None = None
    clock: Callable[[], float] = time.monotonic
    cond: threading.Condition = field(default_factory=threading.Condition)
    exports: dict[str, Export] = field(default_factory=dict)
    released_ids: list[str] = field(default_factory=list)
    recent_released: OrderedDict = field(default_factory=OrderedDict)
    abandoned: OrderedDict = field(default_factory=OrderedDict)   # request id given up -> until (clock)
    counters: ExportCounters = field(default_factory=ExportCounters)
    is_closed: bool = False

    # engine side

    def add(self, request_id: str, block_ids: list[int], num_tokens: int, timeout_s: float,
            registered_at_s: float = 0.0) -> Export:
        with self.cond:
            if request_id in self.exports:
                raise ValueError(f"request {request_id!r} is already exported and not yet released; request ids "
                                 f"must be unique per export")
            if self._is_abandoned(request_id):
                self.counters.num_abandoned += 1
                raise ExportAbandoned(f"request {request_id!r} was given up before its prefill was scheduled")
            export = Export(request_id, list(block_ids), num_tokens, timeout_s, self.clock() + timeout_s,
                            registered_at_s)
            self.exports[request_id] = export
            self.cond.notify_all()    # the reaper may need to wake earlier
            return export

    def mark_ready(self, request_ids: list[str], layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside [0, {self.num_layers})")
        with self.cond:
            for request_id in request_ids:
                export = self.exports.get(request_id)   # gone (timed out or failed): nothing to serve
                if export is not None:
                    export.num_layers_ready = max(export.num_layers_ready, layer + 1)
            self.cond.notify_all()

    def complete(self, request_id: str, first_token: int) -> Export:
        with self.cond:
            export = self.exports.get(request_id)
            if export is None:
                raise KeyError(self.why_gone(request_id))
            export.num_layers_ready = self.num_layers
            export.first_token = int(first_token)
            export.deadline_s = self.clock() + export.timeout_s
            self.cond.notify_all()
            return export

    def fail(self, request_id: str, reason: str) -> None:
        with self.cond:
            export = self.exports.get(request_id)
            if export is None or export.is_acked:
                return
            self.counters.num_failed += 1
            abort = Abort(ErrorCode.PREFILL_FAILED, f"prefill failed: {reason}")
            if not self._abort_locked(export, abort):
                return
        self._released()

    def discard(self, request_id: str, why: str) -> None:
        """The engine ended the request at its first token: nothing will pull this export, released now (a pull
        attached through a handle that went out early is told so, and its session releases it)."""
        with self.cond:
            export = self.exports.get(request_id)
            if export is None or export.is_acked:
                return
            self.counters.num_discarded += 1
            if not self._abort_locked(export, Abort(ErrorCode.NOT_FOUND, f"nothing to pull: {why}")):
                return
        self._released()

    def drain_released(self) -> list[str]:
        with self.cond:
            ids, self.released_ids = self.released_ids, []
            return ids

    # pull-session side

    def attach(self, request_id: str, issued_at_s: float) -> Export:
        with self.cond:
            export = self.exports.get(request_id)
            if export is None:
                raise Abort(ErrorCode.NOT_FOUND, self.why_gone(request_id))
            if issued_at_s < export.registered_at_s:
                raise Abort(ErrorCode.NOT_FOUND, "the handle belongs to an earlier export of this request id, "
                                                 "which is gone; request ids must not be reused")
            if export.is_attached:
                raise Abort(ErrorCode.BUSY, "another pull of this request is in progress")
            export.is_attached = True
            return export

    def wait_layers(self, export: Export, num_sent: int, peer_gone: PeerCheck | None = None) -> int:
        """Blocks until more than `num_sent` layers are ready; returns how many are. Raises the export's Abort,
        or PeerGone when `peer_gone` (polled every PEER_POLL_S while waiting) says the pulling side hung up."""
        with self.cond:
            while export.abort is None and export.num_layers_ready <= num_sent:
                self._wait_watching(peer_gone)
            if export.abort is not None:
                raise export.abort
            return export.num_layers_ready

    def wait_first_token(self, export: Export, peer_gone: PeerCheck | None = None) -> int:
        with self.cond:
            while export.abort is None and export.first_token is None:
                self._wait_watching(peer_gone)
            if export.abort is not None:
                raise export.abort
            return export.first_token

    def _wait_watching(self, peer_gone: PeerCheck | None) -> None:
        if peer_gone is None:
            self.cond.wait()
            return
        self.cond.wait(timeout=PEER_POLL_S)
        why = peer_gone()
        if why:
            raise PeerGone(why)

    def ack(self, export: Export, num_bytes: int) -> None:
        """Records the importer's ACK, unless the export was aborted first (then raises its Abort)."""
        with self.cond:
            if export.abort is not None:
                raise export.abort
            export.is_acked = True
            self.counters.num_pulls += 1
            self.counters.bytes_sent += num_bytes

    def give_up(self, request_id: str, issued_at_s: float, why: str) -> str:
        """The decode side will never pull this export (a handle issued at issued_at_s): released now, unless a
        pull is attached (its session releases it when it ends). Returns "released", "pulling" or "gone"."""
        with self.cond:
            export = self.exports.get(request_id)
            if export is None or issued_at_s < export.registered_at_s or export.is_acked:
                return "gone"
            if export.is_attached:
                return "pulling"
            self.counters.num_given_up += 1
            released = self._abort_locked(export, Abort(ErrorCode.NOT_FOUND, f"given up by the decode side: {why}"))
        if released:
            self._released()
        return "released"

    def give_up_request(self, request_id: str, why: str) -> str:
        """The orchestrator's request `request_id` ended (its client left) and it may not have the handle (it was
        in flight): every export of that request (its id, or the id with the serving layer's "-suffix") that no
        pull holds is released now, and a prefill of it scheduled later exports nothing. Returns "released",
        "pulling" (a session releases it) or "noted"."""
        with self.cond:
            now = self.clock()
            self.abandoned[request_id] = now + ABANDONED_FOR_S
            self.abandoned.move_to_end(request_id)
            while self.abandoned and (len(self.abandoned) > NUM_ABANDONED or next(iter(self.abandoned.values())) < now):
                self.abandoned.popitem(last=False)
            ours = [e for rid, e in self.exports.items() if rid == request_id or rid.startswith(request_id + "-")]
            status = "noted"
            released = 0
            for export in ours:
                if export.is_acked:
                    continue
                if export.is_attached:
                    status = "pulling"
                    continue
                self.counters.num_given_up += 1
                released += self._abort_locked(export, Abort(ErrorCode.NOT_FOUND, f"given up: {why}"))
                status = "released"
        if released:
            self._released()
        return status

    def _is_abandoned(self, request_id: str) -> bool:
        until = self.abandoned.get(request_id) or self.abandoned.get(request_id.rpartition("-")[0])
        return until is not None and until >= self.clock()

    def count_refused(self) -> None:
        with self.cond:
            self.counters.num_refused += 1

    def release(self, export: Export, why: str) -> None:
        with self.cond:
            if not export.is_acked and export.abort is None:
                self.counters.num_broken_pulls += 1
            if not self._release_locked(export, why):
                return
        self._released()

    # reaper and shutdown

    def reap_until_closed(self) -> None:
        """Times out exports whose deadline passed; runs on the exporter's reaper thread until close()."""
        while True:
            num_released = 0
            with self.cond:
                if self.is_closed:
                    return
                now = self.clock()
                for export in list(self.exports.values()):
                    if export.deadline_s <= now and not export.is_acked and export.abort is None:
                        self.counters.num_timeouts += 1
                        abort = Abort(ErrorCode.TIMED_OUT,
                                      f"timed out after {export.timeout_s:g} s without a completed pull")
                        num_released += self._abort_locked(export, abort)
                pending = [e.deadline_s for e in self.exports.values() if not e.is_acked and e.abort is None]
                if not num_released:
                    self.cond.wait(timeout=max(min(pending) - now, 0.0) if pending else None)
            if num_released:
                self._released()

    def close(self, why: str) -> None:
        with self.cond:
            self.is_closed = True
            for export in list(self.exports.values()):
                if export.abort is None and not export.is_acked:
                    self._abort_locked(export, Abort(ErrorCode.CLOSING, why))
            self.cond.notify_all()

    def why_gone(self, request_id: str) -> str:
        why = self.recent_released.get(request_id)
        return f"already released ({why})" if why else "never exported here (or released long ago)"

    def _abort_locked(self, export: Export, abort: Abort) -> bool:
        """Sets the abort; releases at once when no session serves the export. True if released."""
        export.abort = abort
        self.cond.notify_all()
        return False if export.is_attached else self._release_locked(export, abort.message)

    def _release_locked(self, export: Export, why: str) -> bool:
        if self.exports.get(export.request_id) is not export:
            return False
        del self.exports[export.request_id]
        self.released_ids.append(export.request_id)
        self.recent_released[export.request_id] = why
        while len(self.recent_released) > NUM_RECENT_RELEASED:
            self.recent_released.popitem(last=False)
        self.cond.notify_all()
        return True

    def _released(self) -> None:
        if self.on_release is not None:
            self.on_release()
