"""How long the controller takes to add an instance, drain one (idle and under load) and heal a SIGKILL, next to
baselines from the same run: a whole fleet's cold start (`trtpd up -f`), and one instance's own start-up
(from start to ready, as the controller's audit log records it). `--backend trtllm-serve`: the same on its CPU
twin's workers. `--backend tensorrt-llm`: a world per revision (docs/worlds.md), so the scale is a world replaced
under load (command -> new world ready -> promoted -> old world stopped) and the heal a SIGKILLed world.

    .venv/bin/python benchmarks/controller_timings.py [--repeats 3] [--engines engines] [--backend reference]

Needs the reference engines (`./scripts/demo.sh` builds them, or --engines with a `trtpd build` output).
Every figure is min / median / max over the repeats, in seconds. Runs in a temporary TRTPD_HOME and stops
everything it starts.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def summary(values: list[float]) -> str:
    return f"{min(values):6.2f} / {statistics.median(values):6.2f} / {max(values):6.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--engines", type=Path, default=ROOT / "engines")
    p.add_argument("--backend", choices=("reference", "trtllm-serve", "tensorrt-llm"), default="reference")
    args = p.parse_args()
    build_root = (args.engines / "tiny-llama" / "reference-fp16").resolve()
    if not (build_root / "decode-tp1").is_dir():
        print(f"no reference engines under {build_root}; run ./scripts/demo.sh or trtpd build --backend reference")
        return 2
    home = tempfile.mkdtemp(prefix="trtpd-bench-controller-")
    os.environ["TRTPD_HOME"] = home
    from openai import OpenAI

    from trtpd.cli.main import main as trtpd
    from trtpd.cli.controller_client import open_store
    from trtpd.controller.daemon import bring_up
    from trtpd.fleet.records import load_fleet

    spec = Path(home) / "bench.yaml"
    spec.write_text(f"name: bench\nmodel: tiny-llama\nbackend: {args.backend}\n"
                    f"engines: {{build_root: {build_root}}}\n"
                    f"roles:\n  prefill: {{instances: 1}}\n  decode: {{instances: 1}}\n"
                    f"rollout: {{canary_share: 0.5, bake_s: 5, min_requests: 6, max_ttft_ratio: 4, max_tpot_ratio: 4}}\n")

    def last_id() -> int:
        log = open_store("bench").audit_log()
        return log[-1].id if log else 0

    def events(since: int, action: str) -> list:
        return [e for e in open_store("bench").audit_log(since_id=since) if e.action == action]

    def wait_event(since: int, action: str, timeout_s: float = 120):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = events(since, action)
            if found:
                return found[0]
            time.sleep(0.05)
        raise SystemExit(f"no {action} event within {timeout_s} s")

    if args.backend == "tensorrt-llm":
        return worlds(args, spec, trtpd, bring_up, load_fleet, last_id, events, wait_event)
    rows: dict[str, list[float]] = {k: [] for k in (
        "cold start: trtpd up -f (1 prefill + 1 decode, baseline)", "one instance start -> ready (baseline)",
        "scale decode 1->2: command -> new instance routable", "drain decode (idle): drain -> retired",
        "drain decode (under load): drain -> retired", "SIGKILL prefill -> detected",
        "SIGKILL prefill -> replacement ready")}
    for _ in range(args.repeats):
        started = time.monotonic()
        bring_up(spec, progress=lambda *_: None)
        rows["cold start: trtpd up -f (1 prefill + 1 decode, baseline)"].append(time.monotonic() - started)
        from trtpd.fleet.gateway_process import api_key
        fleet = load_fleet("bench")
        client = OpenAI(base_url=f"http://127.0.0.1:{fleet.gateway['port']}/v1", api_key=api_key(fleet), max_retries=0)
        try:
            since = last_id()
            t0 = time.time()
            assert trtpd(["scale", "bench", "decode=2"]) == 0
            ready = wait_event(since, "ready")
            rows["scale decode 1->2: command -> new instance routable"].append(ready.ts - t0)
            rows["one instance start -> ready (baseline)"].append(ready.detail["start_s"])
            since = last_id()
            assert trtpd(["scale", "bench", "decode=1"]) == 0
            rows["drain decode (idle): drain -> retired"].append(wait_event(since, "drained").detail["drain_s"])

            assert trtpd(["scale", "bench", "decode=2"]) == 0
            stop = streaming_load(client, 3)
            since = last_id()
            assert trtpd(["scale", "bench", "decode=1"]) == 0
            rows["drain decode (under load): drain -> retired"].append(wait_event(since, "drained").detail["drain_s"])
            stop()

            victim = next(i for i in load_fleet("bench").instances if i.role == "prefill")
            since = last_id()
            t0 = time.time()
            os.kill(victim.server.pid, signal.SIGKILL)
            rows["SIGKILL prefill -> detected"].append(wait_event(since, "failed").ts - t0)
            rows["SIGKILL prefill -> replacement ready"].append(wait_event(since, "ready").ts - t0)
        finally:
            trtpd(["down", "--name", "bench"])
    report(args, rows)
    return 0


def streaming_load(client, threads: int):
    """`threads` clients streaming 32-token answers until the returned function is called (it waits for them);
    running 2 s before it returns."""
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            list(client.completions.create(model="tiny-llama", prompt="hello " * 40, max_tokens=32, temperature=0,
                                           stream=True))
    running = [threading.Thread(target=load) for _ in range(threads)]
    for t in running:
        t.start()
    time.sleep(2.0)

    def finish() -> None:
        stop.set()
        for t in running:
            t.join(60)
    return finish


def report(args, rows: dict[str, list[float]]) -> None:
    print(f"controller timings, backend {args.backend}, on {os.cpu_count()} cores, {args.repeats} repeats "
          f"(min / median / max, s)")
    width = max(len(k) for k in rows)
    for name, values in rows.items():
        print(f"  {name:<{width}}  {summary(values)}")


def worlds(args, spec, trtpd, bring_up, load_fleet, last_id, events, wait_event) -> int:
    """backend tensorrt-llm: `trtpd scale bench prefill=2` replaces the 1P1D world by a 2P1D one under load."""
    from openai import OpenAI

    from trtpd.fleet.gateway_process import api_key
    rows: dict[str, list[float]] = {k: [] for k in (
        "cold start: trtpd up -f (a 1P1D world, baseline)", "one world start -> ready, idle (baseline)",
        "scale prefill 1->2 under load: command -> new world ready", "  ... -> promoted (gate passed)",
        "  ... -> old world stopped (drained)", "SIGKILL world -> replacement ready")}
    for repeat in range(args.repeats):
        before = last_id() if repeat else 0      # the store outlives a `trtpd down`: this run's events only
        started = time.monotonic()
        bring_up(spec, progress=lambda *_: None)
        rows["cold start: trtpd up -f (a 1P1D world, baseline)"].append(time.monotonic() - started)
        first = events(before, "ready")[0]
        rows["one world start -> ready, idle (baseline)"].append(first.detail["start_s"])
        fleet = load_fleet("bench")
        client = OpenAI(base_url=f"http://127.0.0.1:{fleet.gateway['port']}/v1", api_key=api_key(fleet), max_retries=0)
        try:
            stop = streaming_load(client, 2)
            since, t0 = last_id(), time.time()
            assert trtpd(["scale", "bench", "prefill=2", "--no-wait"]) == 0
            rows["scale prefill 1->2 under load: command -> new world ready"].append(
                wait_event(since, "ready", 300).ts - t0)
            rows["  ... -> promoted (gate passed)"].append(wait_event(since, "rollout_promoting", 300).ts - t0)
            rows["  ... -> old world stopped (drained)"].append(wait_event(since, "drained", 300).ts - t0)
            wait_event(since, "rollout_finished", 60)
            stop()
            victim = load_fleet("bench").instances[0]
            since, t0 = last_id(), time.time()
            os.kill(victim.server.pid, signal.SIGKILL)
            rows["SIGKILL world -> replacement ready"].append(wait_event(since, "ready", 300).ts - t0)
        finally:
            trtpd(["down", "--name", "bench"])
    report(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
