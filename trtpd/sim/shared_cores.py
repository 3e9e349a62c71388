"""Instances that compute on the same host's cores: the CPU reference fleet, where the engines, Triton, the
serving path's stubs and the client share a few cores (on GPUs each instance has devices of its own: nothing is
shared, and the simulator never builds this).

Processor sharing. A step (a prefill batch, a decode or colocated step) is an amount of work: the time the engine
took for it alone when profiled. While the host's demand exceeds its cores, every step in flight progresses at
`cores / demand` of its own speed, and its end moves whenever the demand changes (a step starts or ends). Demand,
in cores:
- one for each step in flight, `step_cores` each while two or more are: each engine computes on one thread
  (trtpd/engine/loader.py sets torch to one), and beside another engine a step costs more than its thread's
  core (the serving path's threads in its process contend with the engine thread for the GIL and for the cores;
  measured on the 2-core reference fleet: a 512-token prefill beside a decode batch of 4 took 1.63x its time
  alone, where one core per step and the serving path's CPU make 1.34x; `trtpd profile --serving` measures it,
  serving_probe.fit_step_cores);
- the serving path's share: `serving_cpu_per_token_s` (the CPU it spends per streamed token outside the engines:
  tritonserver's gRPC and ensemble/BLS hops, the post-processing stub, the client; measured by
  `trtpd profile --serving`, trtpd/bench/serving_probe.py) times the tokens per second the steps in flight
  stream (each decode step's batch over its time alone).
Both terms come from the machine the profile was measured on (`ServingOverhead.host_cores`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

from trtpd.perf.model import SharedCoresSpec
from trtpd.sim.events import EventLoop

__all__ = ["SharedCores", "SharedCoresSpec"]


@dataclass
class _Step:
    instance: Any                 # has busy_s: the step's time beyond its work alone is added there at its end
    alone_s: float                # its work: seconds of the engine alone
    remaining_s: float            # work left
    tokens_per_s: float           # what it streams per second alone
    handler: Callable[[float, Any], None]
    arg: Any
    started_s: float
    version: int = 0              # its latest end event's; any other end event of its instance is stale


class SharedCores:
    def __init__(self, spec: SharedCoresSpec, loop: EventLoop) -> None:
        self.spec = spec
        self.loop = loop
        self.steps: dict[int, _Step] = {}        # by id(instance): at most one step each
        self.slowdown = 1.0                      # demand / cores while it exceeds them, else 1
        self._since_s = 0.0                      # when the steps' remaining work was last brought up to date
        self._versions = itertools.count(1)      # one for all: an instance's earlier steps' events never match

    def run(self, instance: Any, now_s: float, alone_s: float, handler: Callable[[float, Any], None],
            arg: Any = None, tokens_per_s: float = 0.0) -> None:
        """Starts `instance`'s step of `alone_s` seconds of work (already added to instance.busy_s); calls
        handler(end time, arg) when it is done, and adds the time it took beyond alone_s to instance.busy_s."""
        self._progress(now_s)
        step = self.steps[id(instance)] = _Step(instance, alone_s, alone_s, tokens_per_s, handler, arg, now_s)
        if not self._reschedule(now_s):
            self._push(id(instance), step, now_s)

    def _progress(self, now_s: float) -> None:
        if now_s > self._since_s:
            done = (now_s - self._since_s) / self.slowdown
            for step in self.steps.values():
                step.remaining_s -= done
        self._since_s = now_s

    def _reschedule(self, now_s: float) -> bool:
        """Recomputes the slowdown; when it changed, every step's end moves (True)."""
        steps = self.steps.values()
        # a step alone keeps one core: what it costs beside others is measured beside others (a lone step's costs
        # in the server are in its alone time already, ServingOverhead's step costs)
        per_step = self.spec.step_cores if len(self.steps) > 1 else 1.0
        demand = per_step * len(self.steps) + self.spec.serving_cpu_per_token_s * sum(s.tokens_per_s for s in steps)
        slowdown = demand / self.spec.cores if demand > self.spec.cores else 1.0
        if slowdown == self.slowdown:
            return False
        self.slowdown = slowdown
        for key, step in self.steps.items():
            self._push(key, step, now_s)
        return True

    def _push(self, key: int, step: _Step, now_s: float) -> None:
        step.version = next(self._versions)
        self.loop.push(now_s + max(0.0, step.remaining_s) * self.slowdown, self._end, (key, step.version))

    def _end(self, now_s: float, event: tuple[int, int]) -> None:
        key, version = event
        step = self.steps.get(key)
        if step is None or step.version != version:
            return                               # moved since: a later event ends it
        self._progress(now_s)
        del self.steps[key]
        self._reschedule(now_s)
        step.instance.busy_s += (now_s - step.started_s) - step.alone_s
        step.handler(now_s, step.arg)
