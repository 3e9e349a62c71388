"""The engine thread: schedule, run, hand outputs back; the seam between an engine and its shell.

Requests and aborts arrive from other threads through `submit`/`abort` (thread-safe); only this
thread touches the engine. Idle, it sleeps until work arrives, a KV pull completes, or the
prefill scheduler's next bucket deadline.

Failures stay with their request: the engines fail a request whose forward pass or sampling fails; here
a request that `add` refuses gets an error output (and nothing of it stays queued), and a step that
raises (a bug outside any one request) fails the requests in flight, so none waits forever and the
loop does not spin on the same failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from trtpd.engine.protocol import Engine, EngineHooks
from trtpd.engine.request import EngineOutput, EngineRequest, RequestError
from trtpd.engine.step_trace import trace_for

log = logging.getLogger(__name__)


class EngineLoop:
    def __init__(self, engine: Engine, on_output: Callable[[EngineOutput], None], name: str = "engine",
                 idle_poll_s: float = 0.05, step_delay_s: float = 0.0) -> None:
        self.engine = engine
        # fault injection (a deployment spec's step_delay_ms): a pause after every step that produced
        # output, so a revision can be made slow on purpose (the controller's rollout-gate tests)
        self.step_delay_s = step_delay_s
        self.on_output = on_output
        self.idle_poll_s = idle_poll_s
        self._cond = threading.Condition()
        self._inbox: deque[EngineRequest] = deque()
        self._aborts: deque[str] = deque()
        self._stopped = False
        self._live: set[str] = set()   # submitted, no finished output yet (engine thread only)
        self.num_steps = 0
        self.busy_s = 0.0
        self.trace = trace_for(name)   # None unless TRTPD_STEP_TRACE_DIR is set
        self._answered: set[str] = set()   # traced requests whose first token was handed on
        if self.trace is not None and getattr(engine, "model", None) is not None:
            engine.model.trace = self.trace
        engine.bind(EngineHooks(wakeup=self.wakeup, emit=self._emit))
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, request: EngineRequest) -> None:
        if self.trace is not None:   # when the serving path handed the request over (its intake ends here)
            self.trace.write({"kind": "submit", "t_s": time.monotonic(), "id": request.request_id,
                              "prompt_tokens": len(request.prompt_token_ids)})
        with self._cond:
            self._inbox.append(request)
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        with self._cond:
            self._aborts.append(request_id)
            self._cond.notify()

    def wakeup(self) -> None:
        with self._cond:
            self._cond.notify()

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _drain(self) -> list[EngineOutput]:
        outputs = []
        with self._cond:
            inbox, self._inbox = list(self._inbox), deque()
            aborts, self._aborts = list(self._aborts), deque()
        for request in inbox:
            outputs += self._add(request)
        for request_id in aborts:
            outputs += self.engine.abort(request_id)
        return outputs

    def _add(self, request: EngineRequest) -> list[EngineOutput]:
        try:
            self.engine.add(request)
        except Exception as exc:
            log.exception("request %s could not be queued", request.request_id)
            kind = exc.kind if isinstance(exc, RequestError) else "internal"
            return self._fail(request.request_id, f"request {request.request_id}: could not be queued: "
                                                  f"{type(exc).__name__}: {exc}", kind)
        self._live.add(request.request_id)
        return []

    def _fail(self, request_id: str, message: str, kind: str = "internal") -> list[EngineOutput]:
        """An error output for the request, after the engine dropped whatever it holds of it (its blocks)."""
        try:
            self.engine.abort(request_id)
        except Exception:
            log.exception("dropping request %s after its failure failed too", request_id)
        return [EngineOutput(request_id, finished=True, finish_reason="error", error=message, error_kind=kind)]

    def _fail_live(self, exc: Exception) -> list[EngineOutput]:
        outputs = []
        for request_id in sorted(self._live):
            outputs += self._fail(request_id, f"request {request_id}: engine step failed: {type(exc).__name__}: {exc}")
        return outputs

    def _emit(self, outputs: list[EngineOutput]) -> None:
        for out in outputs:
            if out.finished:
                self._live.discard(out.request_id)
            try:
                self.on_output(out)
            except Exception:  # a broken response channel must not stop the engine
                log.exception("delivering output for request %s failed", out.request_id)
            if self.trace is not None:
                self._trace_first(out)

    def _trace_first(self, out: EngineOutput) -> None:
        """The moment a traced request's first token was handed to the serving path (its egress starts here)."""
        if out.new_token_ids and out.request_id not in self._answered:
            self._answered.add(out.request_id)
            self.trace.write({"kind": "first", "t_s": time.monotonic(), "id": out.request_id})
        if out.finished:
            self._answered.discard(out.request_id)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
            failed = False
            try:
                self._emit(self._drain())
                started = time.monotonic()   # the host's one clock: the step trace's times line up across processes
                outputs = self.engine.step()
                step_s = time.monotonic() - started
                if outputs:
                    self.num_steps += 1
                    self.busy_s += step_s
                self._emit(outputs)
                if outputs and self.trace is not None:
                    self.trace.write({"kind": "step", "t_s": started,
                                      "dt_s": step_s, "emit_s": time.monotonic() - started - step_s,
                                      "outputs": len(outputs)})
                if outputs and self.step_delay_s > 0:
                    time.sleep(self.step_delay_s)
            except Exception as exc:
                log.exception("engine step failed; failing the %d requests in flight", len(self._live))
                self._emit(self._fail_live(exc))
                outputs, failed = [], True
            if not failed and (outputs or self.engine.has_work()):
                continue
            with self._cond:
                if self._inbox or self._aborts or self._stopped:
                    continue
                deadline = self.engine.next_wakeup_s()
                remaining = None if deadline is None else deadline - time.monotonic()
                # a deadline already past means the engine is blocked (e.g. KV full): wait for a wakeup
                timeout = self.idle_poll_s if remaining is None or remaining <= 0 else min(self.idle_poll_s, remaining)
                self._cond.wait(timeout)
