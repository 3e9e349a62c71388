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
- the serving path's share: `serving_cpu_per_token_s` (what it takes from the engines per streamed token outside
  them: tritonserver's gRPC and ensemble/BLS hops, the post-processing stub, the client; measured by
  `trtpd profile --serving`, trtpd/bench/serving_probe.py) times the tokens per second the steps in flight
  stream (each decode step's batch over its time alone). Disaggregated it is the CPU that path spends per token
  (/proc); colocated, where the probe measures two instances decoding at three loads (1, 2 and 4 each), the slope
  of their slowdown against the tokens they stream (serving_probe.fit_shared_demand): on the 2-core reference
  fleet between none and half of the CPU it spends (part of it runs while the engine threads wait anyway: the
  pair ran 1.41-1.51x a lone instance's steps at 1 each and 1.53-1.61x at 4, where all of it on top of one core
  per step would make 1.31-1.33x and 1.65-1.68x; benchmarks/pair_slowdown.py).
- one for each of the serving path's jobs in flight: every request's own work outside the engines and beyond its
  tokens (`serving_cpu_per_request_s`: intake, the orchestrator's hops, the KV handoff, the stream's end, in the
  server's processes but the engine stubs; measured on the 2-core reference fleet with lone requests of two tokens:
  10.8-14.6 ms disaggregated, 7.4-11.2 colocated, where a lone request's first token takes 30-50 ms) runs as a job
  of that many seconds from the request's arrival, one thread's core at most, sharing the cores as a step does.
  Beside a request's own prefill alone it changes nothing (two cores, two threads); where requests arrive together
  (bursts) their jobs take the cores from the passes in flight.
The terms come from the machine the profile was measured on (`ServingOverhead.host_cores`).

The steps in flight do not share what the cores give them equally. A pass that computes prompts (a prefill
instance's, or a colocated step with prompts in it, alone or beside decode rows: `prompt_pass`) runs without a
break for its whole length, while a step that only decodes hands its tokens on after every pass and the serving
path's threads wake for each. Linux shares the cores by each thread's lag behind its fair share and runs an
eligible thread (lag >= 0) with the earliest virtual deadline first, its lag kept across a sleep (EEVDF, kernel 6.6
on: Documentation/scheduler/sched-eevdf.rst; kernel/sched/features.h PLACE_LAG): a thread that blocks every few
milliseconds wakes owed CPU and runs ahead of one that never blocks in a pass. Measured on the 2-core reference
fleet (per-thread CPU in the step trace): a prefill beside a decode batch ran 1.56x the curve with its thread on a
core 69% of the pass, the decode passes beside it 1.15x. So a prompt pass weighs `prefill_weight` (measured by
`trtpd profile --serving`, serving_probe.fit_prefill_weight) against 1 for a step that only decodes: the steps'
speeds add up to what processor sharing gives them together (steps in flight x cores / demand), split in proportion
to their weights, and none runs faster than alone. While a prompt pass is in flight each step takes
`prefill_step_cores` where the profile has it instead of `step_cores`: colocated, step_cores comes from two
instances decoding, and a prompt beside the other instance's decode costs the cores differently (measured: the
prompt 1.37x its pass alone, the decode steps 1.22x, so 1.20 cores per step, where two instances decoding took
1.16; in another run 1.23 against 1.07).
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
    weight: float = 1.0           # its share of the cores against other steps' (prefill_weight: a prompt pass)
    prompt_pass: bool = False     # a pass that computes prompts (alone or beside decode rows): it runs without a break
    speed: float = 1.0            # the fraction of its speed alone it runs at now
    version: int = 0              # its latest end event's; any other end event of its instance is stale


@dataclass
class _Job:
    """The serving path's work for one request outside the engines (serving_cpu_per_request_s)."""
    remaining_s: float            # CPU seconds left
    speed: float = 1.0            # the fraction of a core it runs at now
    version: int = 0              # its latest end event's


class SharedCores:
    def __init__(self, spec: SharedCoresSpec, loop: EventLoop) -> None:
        self.spec = spec
        self.loop = loop
        self.steps: dict[int, _Step] = {}        # by id(instance): at most one step each
        self.jobs: dict[int, _Job] = {}          # the serving path's per-request work in flight, by number
        self._job_ids = itertools.count()
        self._since_s = 0.0                      # when the steps' remaining work was last brought up to date
        self._versions = itertools.count(1)      # one for all: an instance's earlier steps' events never match

    def run(self, instance: Any, now_s: float, alone_s: float, handler: Callable[[float, Any], None],
            arg: Any = None, tokens_per_s: float = 0.0, prompt_pass: bool = False) -> None:
        """Starts `instance`'s step of `alone_s` seconds of work (already added to instance.busy_s); calls
        handler(end time, arg) when it is done, and adds the time it took beyond alone_s to instance.busy_s.
        prompt_pass: a pass that computes prompts, alone or beside decode rows, and hands nothing on until it ends
        (it weighs spec.prefill_weight in the sharing, and steps beside it take spec.prefill_step_cores)."""
        self._progress(now_s)
        weight = self.spec.prefill_weight if prompt_pass else 1.0
        step = self.steps[id(instance)] = _Step(instance, alone_s, alone_s, tokens_per_s, handler, arg, now_s,
                                                weight, prompt_pass)
        self._reschedule(now_s, step)

    def serve(self, now_s: float, cpu_s: float) -> None:
        """Starts a job of the serving path: `cpu_s` seconds of one thread's work on the shared cores (a request's
        work outside the engines, from its arrival); nothing waits for it, the steps beside it slow."""
        if cpu_s <= 0:
            return
        self._progress(now_s)
        job = self.jobs[next(self._job_ids)] = _Job(cpu_s)
        self._reschedule(now_s, started_job=job)

    def _progress(self, now_s: float) -> None:
        if now_s > self._since_s:
            elapsed_s = now_s - self._since_s
            for item in [*self.steps.values(), *self.jobs.values()]:
                item.remaining_s -= elapsed_s * item.speed
        self._since_s = now_s

    def _reschedule(self, now_s: float, started: _Step | None = None, started_job: _Job | None = None) -> None:
        """Recomputes the steps' and jobs' speeds (each a fraction of its speed alone); every one whose speed changed
        (and one just started) gets a new end."""
        steps, jobs = list(self.steps.values()), list(self.jobs.values())
        # a step alone keeps one core: what it costs beside others is measured beside others (a lone step's costs
        # in the server are in its alone time already, ServingOverhead's step costs)
        if len(steps) < 2:
            per_step = 1.0
        elif self.spec.prefill_step_cores is not None and any(s.prompt_pass for s in steps):
            per_step = self.spec.prefill_step_cores     # a prompt's pass beside a step that streams
        else:
            per_step = self.spec.step_cores
        demand = (per_step * len(steps) + len(jobs)
                  + self.spec.serving_cpu_per_token_s * sum(s.tokens_per_s for s in steps))
        weights = [s.weight for s in steps] + [1.0] * len(jobs)
        if demand <= self.spec.cores:
            speeds = [1.0] * len(weights)
        elif self.spec.prefill_weight == 1.0 or len(set(weights)) == 1:
            speeds = [self.spec.cores / demand] * len(weights)     # equal weights: plain processor sharing
        else:
            speeds = share(len(weights) * self.spec.cores / demand, weights)
        for step, speed in zip(steps, speeds):   # _push leaves self.steps as it is
            if speed != step.speed or step is started:
                step.speed = speed
                self._push(step, id(step.instance), self._end, now_s)
        for key, job, speed in zip(list(self.jobs), jobs, speeds[len(steps):]):
            if speed != job.speed or job is started_job:
                job.speed = speed
                self._push(job, key, self._job_end, now_s)

    def _push(self, item: _Step | _Job, key: int, end: Callable[[float, tuple[int, int]], None],
              now_s: float) -> None:
        """A new end event for a step or job at its speed now; any earlier one of it goes stale."""
        item.version = next(self._versions)
        self.loop.push(now_s + max(0.0, item.remaining_s) / item.speed, end, (key, item.version))

    def _finish(self, table: dict, now_s: float, event: tuple[int, int]) -> _Step | _Job | None:
        """The step or job an end event names, taken out of `table` with the speeds recomputed; None where it moved
        since (a later event ends it)."""
        key, version = event
        item = table.get(key)
        if item is None or item.version != version:
            return None
        self._progress(now_s)
        del table[key]
        self._reschedule(now_s)
        return item

    def _end(self, now_s: float, event: tuple[int, int]) -> None:
        step = self._finish(self.steps, now_s, event)
        if step is not None:
            step.instance.busy_s += (now_s - step.started_s) - step.alone_s
            step.handler(now_s, step.arg)

    def _job_end(self, now_s: float, event: tuple[int, int]) -> None:
        self._finish(self.jobs, now_s, event)


def share(total: float, weights: list[float]) -> list[float]:
    """Speeds in proportion to `weights` that add up to `total` (below len(weights)), none above 1: the steps whose
    share would exceed their speed alone run at it, and the rest share what is left in proportion to their weights."""
    speeds = [0.0] * len(weights)
    free = set(range(len(weights)))
    left = total
    while free:
        scale = left / sum(weights[i] for i in free)
        capped = {i for i in free if scale * weights[i] >= 1.0}
        if not capped:
            for i in free:
                speeds[i] = scale * weights[i]
            break
        for i in capped:
            speeds[i] = 1.0
        free -= capped
        left -= len(capped)
    return speeds
