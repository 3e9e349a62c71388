"""`trtpd bench`'s runs: resolve targets, make the requests, send them at each rate to each target in turn.

A target is a fleet's OpenAI gateway (`--name` of a fleet), any OpenAI-compatible base URL (`--url`), or a
single-server deployment's Triton gRPC ensemble (`--name` of a deployment started with `trtpd up`). Every
target gets the same requests (same prompts, lengths and arrival offsets) at a rate, one target after the
other, so a disaggregated fleet and a colocated one started on the same cores compare like for like.

Arrivals: the workload's process (configs/workloads/*.yaml, `arrival: {process: poisson | gamma, cv: X}`),
or `--arrival` / `--cv` replacing it; trtpd/sim/workload.py draws the inter-arrival times.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from trtpd.bench.client import BenchRequest, RequestResult
from trtpd.bench.prompts import prompt_with_tokens
from trtpd.bench.report import BenchRun, Sweep, TargetInfo
from trtpd.errors import ConfigError, TrtpdError
from trtpd.sim.workload import ArrivalSpec, WorkloadSpec, generate_requests

DEFAULT_MAX_INPUT_LEN = 2048
TRITON_MODEL = "ensemble"


@dataclass(frozen=True)
class SweepTarget:
    info: TargetInfo
    model: str                      # the OpenAI `model`, or the Triton model (the ensemble)
    tokenizer_dir: str | None       # the checkpoint folder with the tokenizer, when known
    max_input_len: int
    api_key: str | None = None      # sent as `Authorization: Bearer` to an OpenAI target

    @property
    def label(self) -> str:
        return self.info.label


def _openai_model(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str:
    """The model the server lists first at GET {base_url}/models."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{base_url}/models", headers=headers),
                                    timeout=timeout_s) as resp:
            data = json.loads(resp.read().decode())
        return str(data["data"][0]["id"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
        raise TrtpdError(f"{base_url}/models: no OpenAI API answers there ({type(exc).__name__}: {exc}); "
                         f"check the URL (it ends in /v1) or give --model") from None


def normalize_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"--url {url}: expected an OpenAI base URL such as http://127.0.0.1:8000/v1")
    path = parts.path.rstrip("/") or "/v1"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def resolve_target(name_or_url: str, model: str | None = None, api_key: str | None = None) -> SweepTarget:
    """A URL (http://...; the key from `api_key` or $OPENAI_API_KEY), a fleet's name (its gateway, with the
    fleet's own key) or a single-server deployment's name (its gRPC)."""
    import os

    from trtpd.fleet.gateway_process import api_key as fleet_api_key
    from trtpd.fleet.records import is_fleet, load_fleet

    if name_or_url.startswith(("http://", "https://")):
        url = normalize_url(name_or_url)
        key = api_key or os.environ.get("OPENAI_API_KEY")
        return SweepTarget(TargetInfo(urllib.parse.urlsplit(url).netloc, "openai", url), model or _openai_model(url, key),
                      None, DEFAULT_MAX_INPUT_LEN, key)
    if is_fleet(name_or_url):
        fleet = load_fleet(name_or_url)
        if not fleet.gateway or not fleet.gateway.get("port"):
            raise TrtpdError(f"fleet {fleet.name!r} has no gateway running (restart it with `trtpd up --fleet "
                             f"--name {fleet.name} --replace`, which starts one)")
        url = f"http://{fleet.gateway.get('host', '127.0.0.1')}:{fleet.gateway['port']}/v1"
        key = api_key or fleet_api_key(fleet)
        return SweepTarget(TargetInfo(f"{fleet.name} ({fleet.mode})", "openai", url, fleet.mode),
                      model or _openai_model(url, key), fleet.tokenizer_dir,
                      min((i.max_input_len for i in fleet.instances), default=DEFAULT_MAX_INPUT_LEN), key)
    from trtpd.fleet.deployment import Deployment

    dep = Deployment.load(name_or_url)
    return SweepTarget(TargetInfo(f"{dep.name} ({dep.mode})", "triton", dep.server.grpc_url, dep.mode),
                  model or TRITON_MODEL, str(Path(dep.build_root) / "checkpoint"), DEFAULT_MAX_INPUT_LEN)


def unique_labels(targets: list[SweepTarget]) -> list[SweepTarget]:
    seen: dict[str, int] = {}
    out = []
    for t in targets:
        n = seen.get(t.label, 0) + 1
        seen[t.label] = n
        out.append(t if n == 1 else replace(t, info=replace(t.info, label=f"{t.label} #{n}")))
    return out


def with_arrival(spec: WorkloadSpec, process: str | None, cv: float | None) -> WorkloadSpec:
    """The workload with its arrival process replaced (`--arrival`, `--cv`); unchanged when neither given."""
    if process is None and cv is None:
        return spec
    if spec.trace is not None:
        raise ConfigError(f"--arrival/--cv: workload {spec.name!r} replays a trace, whose arrival times are fixed")
    process = process or ("gamma" if cv is not None else spec.arrival.process)
    if process == "poisson":
        if cv is not None and cv != 1.0:
            raise ConfigError(f"--cv {cv:g}: Poisson arrivals have CV 1; use --arrival gamma for another CV")
        return spec.model_copy(update={"arrival": ArrivalSpec(process="poisson")})
    if cv is None:
        cv = spec.arrival.cv if spec.arrival.process == "gamma" else None
    if cv is None:
        raise ConfigError("--arrival gamma: give --cv (the coefficient of variation of the inter-arrival times, "
                          "e.g. 2 for bursty traffic; 1 is Poisson)")
    return spec.model_copy(update={"arrival": ArrivalSpec(process="gamma", cv=cv)})


def make_requests(tokenizer, spec: WorkloadSpec, rate_per_s: float, num_requests: int, seed: int,
                  max_input_len: int, prompts: dict | None = None) -> list[BenchRequest]:
    """The requests of one run (arrival offsets from the first). With one seed, the lengths (drawn after the
    inter-arrival times, as many draws at every rate) and the prompts are the same at every rate;
    `prompts` caches the prompt of each (index, length) across rates."""
    arrays = generate_requests(spec, rate_per_s, num_requests, seed)
    start = arrays.arrival_s[0] if len(arrays) else 0.0
    cache = {} if prompts is None else prompts
    out = []
    for i, (arrival, n_in, n_out) in enumerate(zip(arrays.arrival_s, arrays.input_tokens, arrays.output_tokens)):
        n_in = max(2, min(int(n_in), max_input_len))
        if (i, n_in) not in cache:
            cache[(i, n_in)] = prompt_with_tokens(tokenizer, n_in, seed=seed * 100_003 + i)
        out.append(BenchRequest(f"req-{i}", cache[(i, n_in)], max(1, int(n_out)), arrival - start, n_in))
    return out


Sender = Callable[[SweepTarget, list[BenchRequest], float, Callable[[RequestResult], None] | None], list[RequestResult]]


def send(target: SweepTarget, requests: list[BenchRequest], timeout_s: float,
         on_done: Callable[[RequestResult], None] | None = None) -> list[RequestResult]:
    if target.info.kind == "openai":
        from trtpd.bench.openai_load import run_openai
        return run_openai(target.info.url, target.model, requests, timeout_s=timeout_s, on_done=on_done,
                          api_key=target.api_key)
    from trtpd.bench.client import run_stream
    return run_stream(target.info.url, requests, model=target.model, timeout_s=timeout_s, on_done=on_done)


def run_sweep(targets: list[SweepTarget], sweep: Sweep, requests_at: Callable[[float], list[BenchRequest]],
              timeout_s: float = 300.0, warmup: int = 1, console=None, sender: Sender = send) -> Sweep:
    """For each rate (in the order given), for each target in turn: the same requests; a progress bar per run.
    Each target first gets `warmup` requests (the first ones, sent at once), not measured."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    warmed: set[str] = set()
    width = max(len(t.label) for t in targets) + 10
    for rate in sweep.rates:
        requests = requests_at(rate)
        for target in targets:
            if target.label not in warmed and warmup:
                batch = [replace(r, request_id=f"warmup-{i}", send_at_s=0.0) for i, r in enumerate(requests[:warmup])]
                bad = [r for r in sender(target, batch, timeout_s, None) if r.error is not None or not r.token_times_s]
                if bad:
                    raise TrtpdError(f"{target.label} ({target.info.url}): the warm-up request failed: "
                                     f"{bad[0].error or 'no tokens came back'}")
                warmed.add(target.label)
            title = f"{target.label} @ {rate:g}/s"
            with Progress(TextColumn(f"  {title:<{width}}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console, transient=False) as progress:
                task = progress.add_task(title, total=len(requests))
                results = sender(target, requests, timeout_s, lambda _: progress.advance(task))
            errors = sum(1 for r in results if r.error is not None)
            if errors:
                first = next(r.error for r in results if r.error is not None)
                console.print(f"  {title}: {errors} of {len(results)} requests failed, e.g. {first}")
            sweep.runs.append(BenchRun(target.label, rate, results))
    return sweep


def load_tokenizer(targets: list[SweepTarget], tokenizer_dir: Path | None):
    """The tokenizer that sizes the prompts: --tokenizer, else the first target's checkpoint."""
    from trtpd.engine.checkpoint import load_checkpoint

    folder = tokenizer_dir or next((Path(t.tokenizer_dir) for t in targets if t.tokenizer_dir), None)
    if folder is None:
        raise ConfigError("--url: give --tokenizer CHECKPOINT_DIR (the reference checkpoint folder holding the "
                          "tokenizer, e.g. engines/tiny-llama/checkpoint) to size the prompts")
    return load_checkpoint(Path(folder)).load_tokenizer()
