"""`trtpd bench`'s results as data, JSON, a Markdown report and PNG plots (pure: inputs -> files).

A `Sweep` holds every run of a bench invocation: for each rate and each target (a fleet's OpenAI gateway,
an OpenAI URL, a single-server deployment's Triton gRPC), the per-request results. Everything else
(summaries, goodput, tables, plots) is computed from those, so a report can be written again from the JSON.

Goodput, as DistServe defines it: the highest request rate at which the SLO attainment (the share of
requests meeting both TTFT <= ttft_slo and TPOT <= tpot_slo) is at least the target, e.g. 90%. Over a
sweep of measured rates that is the highest rate r such that every measured rate up to r attains it
(a rate that fails below a passing one ends the range: the system does not serve "up to" it). Per rate
we also report goodput requests/s = offered rate x attainment.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from trtpd.bench.client import RequestResult
from trtpd.bench.stats import BenchSummary, comparison_table, summarize

JSON_VERSION = 1


@dataclass(frozen=True)
class TargetInfo:
    label: str          # unique within a sweep: the column heading
    kind: str           # "openai" (a gateway / OpenAI URL) | "triton" (a single server's gRPC ensemble)
    url: str
    mode: str = ""      # disaggregated | colocated | "" when unknown (a bare URL)

    def to_dict(self) -> dict:
        return {"label": self.label, "kind": self.kind, "url": self.url, "mode": self.mode}


@dataclass
class BenchRun:
    target: str                     # TargetInfo.label
    rate_per_s: float
    results: list[RequestResult]


@dataclass
class Sweep:
    workload: str
    arrival: str                    # "poisson" | "gamma"
    cv: float                       # of the inter-arrival times (1.0 for poisson)
    num_requests: int
    seed: int
    ttft_slo_s: float | None
    tpot_slo_s: float | None
    attainment_target: float        # goodput: the share of requests that must meet both SLOs
    targets: list[TargetInfo]
    rates: list[float]
    runs: list[BenchRun] = field(default_factory=list)

    @property
    def has_slo(self) -> bool:
        return self.ttft_slo_s is not None and self.tpot_slo_s is not None

    def run(self, target: str, rate: float) -> BenchRun | None:
        for r in self.runs:
            if r.target == target and r.rate_per_s == rate:
                return r
        return None

    def summary(self, target: str, rate: float) -> BenchSummary | None:
        run = self.run(target, rate)
        if run is None:
            return None
        return summarize(target, run.results, self.ttft_slo_s, self.tpot_slo_s)

    def goodput_requests_per_s(self, target: str, rate: float) -> float | None:
        """Offered rate x SLO attainment (None without SLOs or without that run)."""
        s = self.summary(target, rate)
        return None if s is None or s.slo_attainment is None else rate * s.slo_attainment

    def attainment_curve(self, target: str) -> list[tuple[float, float]]:
        out = []
        for rate in sorted(self.rates):
            s = self.summary(target, rate)
            if s is not None and s.slo_attainment is not None:
                out.append((rate, s.slo_attainment))
        return out

    def goodput_rate(self, target: str) -> float | None:
        return goodput_rate(self.attainment_curve(target), self.attainment_target)


def goodput_rate(points: list[tuple[float, float]], attainment_target: float) -> float | None:
    """DistServe's goodput over measured (rate, attainment) points: the highest rate such that it and every
    lower measured rate attain at least `attainment_target`; None when the lowest rate already misses it."""
    best = None
    for rate, attainment in sorted(points):
        if attainment + 1e-12 < attainment_target:
            break
        best = rate
    return best


# ---- JSON --------------------------------------------------------------------------------------------------

def _result_to_dict(r: RequestResult, t0: float) -> dict:
    return {"request_id": r.request_id, "num_prompt_tokens": r.num_prompt_tokens, "sent_s": r.sent_s - t0,
            "token_times_s": [t - t0 for t in r.token_times_s], "num_output_tokens": r.num_tokens,
            "text": r.text, "perf": dict(r.perf), "error": r.error}


def _result_from_dict(d: dict) -> RequestResult:
    return RequestResult(d["request_id"], int(d["num_prompt_tokens"]), sent_s=float(d["sent_s"]),
                         token_times_s=[float(t) for t in d["token_times_s"]], text=d.get("text", ""),
                         perf={k: float(v) for k, v in d.get("perf", {}).items()}, error=d.get("error"),
                         done=True, num_output_tokens=int(d.get("num_output_tokens", 0)))


def _finite(x):
    """JSON has no NaN: percentiles of an empty set become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def to_json(sweep: Sweep) -> dict:
    """Settings, per (target, rate) summaries and goodput (for readers), and every request's timings
    (seconds from the run's first send) from which `from_json` rebuilds the sweep."""
    summaries, runs = [], []
    for run in sweep.runs:
        s = sweep.summary(run.target, run.rate_per_s)
        assert s is not None
        summaries.append({"target": run.target, "rate_per_s": run.rate_per_s, "summary": _finite(s.to_dict()),
                          "goodput_requests_per_s": sweep.goodput_requests_per_s(run.target, run.rate_per_s)})
        t0 = min((r.sent_s for r in run.results), default=0.0)
        runs.append({"target": run.target, "rate_per_s": run.rate_per_s,
                     "requests": [_result_to_dict(r, t0) for r in run.results]})
    return {"version": JSON_VERSION, "workload": sweep.workload,
            "arrival": {"process": sweep.arrival, "cv": sweep.cv}, "num_requests": sweep.num_requests,
            "seed": sweep.seed,
            "slo": {"ttft_s": sweep.ttft_slo_s, "tpot_s": sweep.tpot_slo_s, "attainment": sweep.attainment_target},
            "targets": [t.to_dict() for t in sweep.targets], "rates_per_s": list(sweep.rates),
            "goodput_rate_per_s": {t.label: sweep.goodput_rate(t.label) for t in sweep.targets},
            "summaries": summaries, "runs": runs}


def from_json(d: dict) -> Sweep:
    if d.get("version") != JSON_VERSION:
        raise ValueError(f"bench JSON version {d.get('version')!r}: this trtpd reads version {JSON_VERSION}")
    slo = d["slo"]
    return Sweep(d["workload"], d["arrival"]["process"], float(d["arrival"]["cv"]), int(d["num_requests"]),
                 int(d["seed"]), slo["ttft_s"], slo["tpot_s"], float(slo["attainment"]),
                 [TargetInfo(**t) for t in d["targets"]], [float(r) for r in d["rates_per_s"]],
                 [BenchRun(r["target"], float(r["rate_per_s"]), [_result_from_dict(x) for x in r["requests"]])
                  for r in d["runs"]])


def write_json(sweep: Sweep, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(sweep), indent=1, allow_nan=False))
    return path


def read_json(path: Path) -> Sweep:
    return from_json(json.loads(Path(path).read_text()))


# ---- tables ------------------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def rate_table(sweep: Sweep, rate: float) -> list[list[str]]:
    """Header row, then rows: metric, one column per target (TTFT/ITL/TPOT/worst stall P50/P90/P99,
    tokens/s, SLO attainment, goodput requests/s)."""
    labels = [t.label for t in sweep.targets if sweep.run(t.label, rate) is not None]
    summaries = [sweep.summary(label, rate) for label in labels]
    rows = [["metric", *labels]] + comparison_table(summaries)    # type: ignore[arg-type]
    if sweep.has_slo:
        gp = [sweep.goodput_requests_per_s(label, rate) for label in labels]
        rows.append(["goodput (req/s) = rate x attainment"] + ["-" if g is None else f"{g:.2f}" for g in gp])
    return rows


def goodput_table(sweep: Sweep) -> list[list[str]]:
    """Header row, then one row per target: its goodput (highest rate attaining the target) and its
    attainment at each rate."""
    rates = sorted(sweep.rates)
    rows = [["target", f"goodput (req/s at >= {sweep.attainment_target:.0%})",
             *[f"attainment @ {r:g}/s" for r in rates]]]
    for t in sweep.targets:
        g = sweep.goodput_rate(t.label)
        rows.append([t.label, f"< {rates[0]:g} (lowest rate misses)" if g is None else f"{g:g}",
                     *[_pct(s.slo_attainment) if (s := sweep.summary(t.label, r)) is not None else "-"
                       for r in rates]])
    return rows


def markdown_table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
    return "\n".join(lines)


# ---- plots -------------------------------------------------------------------------------------------------

def _cdf(ax, values_ms: list[float], label: str) -> None:
    xs = sorted(values_ms)
    if not xs:
        ax.plot([], [], label=f"{label} (no data)")
        return
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=label)


def plot_cdfs(sweep: Sweep, rate: float, path: Path) -> Path:
    """TTFT CDF and ITL CDF (every inter-token gap, pooled), one line per target, at one rate."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), dpi=100)
    ttft_ax, itl_ax = fig.subplots(1, 2)
    for t in sweep.targets:
        run = sweep.run(t.label, rate)
        if run is None:
            continue
        ok = [r for r in run.results if r.error is None and r.token_times_s]
        _cdf(ttft_ax, [r.ttft_s * 1e3 for r in ok], t.label)
        _cdf(itl_ax, [g * 1e3 for r in ok for g in r.gaps_s], t.label)
    for ax, what, slo in ((ttft_ax, "TTFT", sweep.ttft_slo_s), (itl_ax, "inter-token latency", sweep.tpot_slo_s)):
        if slo is not None:
            ax.axvline(slo * 1e3, color="grey", linestyle="--", linewidth=1,
                       label=f"{'TTFT' if ax is ttft_ax else 'TPOT'} SLO {slo * 1e3:g} ms")
        ax.set_xlabel(f"{what} (ms)")
        ax.set_ylabel("share of " + ("requests" if ax is ttft_ax else "gaps"))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{sweep.workload}, {sweep.arrival} arrivals at {rate:g} requests/s")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def plot_goodput(sweep: Sweep, path: Path) -> Path:
    """SLO attainment and goodput requests/s (rate x attainment) against the offered rate, per target."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), dpi=100)
    att_ax, gp_ax = fig.subplots(1, 2)
    rates = sorted(sweep.rates)
    for t in sweep.targets:
        curve = sweep.attainment_curve(t.label)
        if not curve:
            continue
        xs = [r for r, _ in curve]
        att_ax.plot(xs, [a * 100 for _, a in curve], marker="o", label=t.label)
        gp_ax.plot(xs, [r * a for r, a in curve], marker="o", label=t.label)
    att_ax.axhline(sweep.attainment_target * 100, color="grey", linestyle="--", linewidth=1,
                   label=f"target {sweep.attainment_target:.0%}")
    gp_ax.plot(rates, rates, color="grey", linestyle=":", linewidth=1, label="offered rate")
    att_ax.set_ylabel("SLO attainment (%)")
    att_ax.set_ylim(0, 102)
    gp_ax.set_ylabel("goodput (requests/s meeting both SLOs)")
    gp_ax.set_ylim(bottom=0)
    for ax in (att_ax, gp_ax):
        ax.set_xlabel("offered rate (requests/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"TTFT <= {sweep.ttft_slo_s * 1e3:g} ms and TPOT <= {sweep.tpot_slo_s * 1e3:g} ms"
                 if sweep.has_slo else "no SLOs given")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


# ---- the report --------------------------------------------------------------------------------------------

def plot_names(sweep: Sweep, stem: str) -> dict:
    """File names (relative to the report's folder) of the plots a report links."""
    names: dict = {"cdf": {rate: f"{stem}-rate-{rate:g}-cdf.png" for rate in sweep.rates}}
    if sweep.has_slo:
        names["goodput"] = f"{stem}-goodput.png"
    return names


def markdown(sweep: Sweep, plots: dict | None = None) -> str:
    plots = plots or {}
    arrival = "Poisson" if sweep.arrival == "poisson" else f"Gamma (CV {sweep.cv:g})"
    out = ["# trtpd bench", "",
           f"Workload `{sweep.workload}`, {arrival} arrivals, {sweep.num_requests} requests per run, seed "
           f"{sweep.seed}; the same requests (prompts and lengths) at every target, targets one after the other.", ""]
    if sweep.has_slo:
        out += [f"SLOs: TTFT <= {sweep.ttft_slo_s * 1e3:g} ms and TPOT <= {sweep.tpot_slo_s * 1e3:g} ms. "
                f"Goodput (DistServe): the highest rate at which at least {sweep.attainment_target:.0%} of "
                f"requests meet both (every lower measured rate too); per rate, goodput requests/s = "
                f"rate x attainment.", ""]
    else:
        out += ["No SLOs given (`--ttft-slo-ms`, `--tpot-slo-ms`): no attainment or goodput.", ""]
    out += ["## Targets", "", markdown_table([["target", "kind", "URL", "mode"]] +
                                            [[t.label, t.kind, t.url, t.mode or "-"] for t in sweep.targets]), ""]
    if sweep.has_slo:
        out += ["## Goodput", "", markdown_table(goodput_table(sweep)), ""]
        if "goodput" in plots:
            out += [f"![SLO attainment and goodput against rate]({plots['goodput']})", ""]
    for rate in sweep.rates:
        out += [f"## {rate:g} requests/s", "", markdown_table(rate_table(sweep, rate)), ""]
        if rate in plots.get("cdf", {}):
            out += [f"![TTFT and ITL CDFs at {rate:g} requests/s]({plots['cdf'][rate]})", ""]
    return "\n".join(out)


def write_report(sweep: Sweep, path: Path) -> list[Path]:
    """The Markdown report at `path` and its PNG plots next to it; returns every file written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = plot_names(sweep, path.stem)
    written = [plot_cdfs(sweep, rate, path.parent / name) for rate, name in names["cdf"].items()]
    if "goodput" in names:
        written.append(plot_goodput(sweep, path.parent / names["goodput"]))
    path.write_text(markdown(sweep, names))
    return [path, *written]
