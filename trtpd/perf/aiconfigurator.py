"""Prefill and decode curves from NVIDIA AIConfigurator's measured per-operator database, offline.

AIConfigurator (aiconfigurator-core on PyPI, Apache-2.0) ships, per system (h100_sxm, h200_sxm, a100_sxm,
b200_sxm, ...) and framework version, latencies of single operators measured on the GPU: GEMMs by
(m, n, k, dtype), context attention by (batch, isl, heads, kv heads, head dim, dtypes), generation
attention by (batch, context = isl + step, ...) and TP all-reduce by (GPUs, message elements), in
milliseconds (systems/data/<system>/<op>/<framework>/<version>/*.parquet).

For a dense GQA model at TP t on one device's share, a forward pass is, per layer: the QKV, O,
gate-up and down GEMMs (m = tokens in the pass), its attention, and two all-reduces of tokens x
hidden (t > 1); plus the LM head (one row per sequence). Prefill T tokens = one sequence of T (the curve's
axis is batched tokens; a batch of shorter prompts has less attention than this: context_s(batch, isl)
composes that case); decode = batch b at context c.
Between measured points: linear in each axis (GEMM shapes not in the table scale from the nearest
measured (n, k) by n x k). The sum is the operators only: no launch, scheduling or sampling time. The LM
head is a bf16 GEMM in fp8 checkpoints too, as TensorRT-LLM runs it. AIConfigurator's own estimate adds
what its tables do not measure, from speed-of-light formulas with empirical factors: the norms, the
activation, the embedding, and the RoPE and KV-cache write fused into context attention (about 5% of a
Qwen3-32B pass; benchmarks/aic_reproduce.py compares the two per operator).

Reading parquet needs pyarrow (AIConfigurator's own environment has it); a table may also be given as
a CSV next to it with the same stem (how the unit tests carry a small extract). trtpd's .venv has no
pyarrow (and AIConfigurator needs numpy >= 2, .venv pins numpy < 2), so export_database() has
AIConfigurator's environment (.venv-aic, `TRTPD_SETUP_AIC=1 scripts/setup.sh`) write the installed tables
as CSV (trtpd/perf/aic_export.py) for database_root() to read.
"""

from __future__ import annotations

import bisect
import csv
import importlib.util
import json
import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from trtpd.catalog import ModelSpec
from trtpd.errors import ConfigError
from trtpd.perf.measured import DecodeGrid, MeasuredProfile, PrefillCurve

PREFILL_TOKENS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DECODE_CONTEXTS = (128, 256, 512, 1024, 2048, 4096, 8192)
GEMM_DTYPES = {"fp8": "fp8", "fp16": "bfloat16", "bf16": "bfloat16"}
KV_DTYPES = {"fp8": "fp8", "fp16": "bfloat16", "bf16": "bfloat16"}
AIC_SETUP_HINT = "run `TRTPD_SETUP_AIC=1 scripts/setup.sh` (it creates .venv-aic with aiconfigurator 0.12.0)"
EXPORT_SCRIPT = Path(__file__).with_name("aic_export.py")


def aic_python(venv: Path | None = None) -> Path:
    """The Python of AIConfigurator's own environment: venv, else $TRTPD_AIC_VENV, else the checkout's .venv-aic."""
    venv = venv or Path(os.environ.get("TRTPD_AIC_VENV") or Path(__file__).resolve().parents[2] / ".venv-aic")
    python = venv / "bin" / "python"
    if not python.is_file():
        raise ConfigError(f"{venv}: no AIConfigurator environment here; {AIC_SETUP_HINT}")
    return python


def export_database(system: str, out: Path, python: Path | None = None, framework: str = "trtllm",
                    root: Path | None = None, ops: tuple[str, ...] | None = None) -> dict:
    """Has AIConfigurator's environment (which has pyarrow) write its tables for system (from root, default
    its installed database) as CSV under out, where database_root(out) finds them; returns what
    trtpd/perf/aic_export.py reports."""
    python = python or aic_python()
    cmd = [str(python), str(EXPORT_SCRIPT), "--system", system, "--framework", framework, "--out", str(out)]
    cmd += (["--root", str(root)] if root else []) + (["--ops", ",".join(ops)] if ops else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise ConfigError(f"exporting AIConfigurator's {system} tables with {python} failed: "
                          f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def database_root(explicit: Path | None = None) -> Path:
    """aiconfigurator_core's systems/data folder: the given one, else the installed package's."""
    if explicit is not None:
        for candidate in (explicit, explicit / "systems" / "data", explicit / "aiconfigurator_core" / "systems" / "data"):
            if candidate.is_dir() and any(candidate.iterdir()):
                return candidate
        raise ConfigError(f"{explicit}: no AIConfigurator database here (expected systems/data/<system>/...)")
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("AIConfigurator's database not found: pip install aiconfigurator-core (in its own "
                          "environment: it needs numpy >= 2) and pass --aic-db <its aiconfigurator_core folder>")
    return Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"


def readable_database(explicit: Path | None, system: str, framework: str, scratch: Path) -> Path:
    """The database root to read for system: the given (or this Python's installed) one when this Python can
    read it (pyarrow, or CSV tables), else the same tables exported to CSV under scratch through
    AIConfigurator's own environment (aic_python()); scratch must outlive the AicSystem reading it."""
    try:
        root: Path | None = database_root(explicit)
    except ConfigError:
        if explicit is not None:
            raise
        root = None
    if root is not None and (importlib.util.find_spec("pyarrow") is not None
                             or any((root / system).glob("*/*/*/*.csv"))):
        return root
    try:
        python = aic_python()
    except ConfigError as exc:
        what = f"{root}: its parquet tables need pyarrow, which this Python lacks" if root else \
            "AIConfigurator's database is not installed in this Python"
        raise ConfigError(f"{what}; and {exc}") from None
    export_database(system, scratch, python, framework, root=root)
    return scratch


def read_table(path: Path) -> list[dict]:
    """Rows of one operator table: parquet (pyarrow), or a CSV with the same stem."""
    csv_path = path.with_suffix(".csv")
    if csv_path.is_file():
        with csv_path.open() as f:
            return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{path}: reading AIConfigurator's parquet tables needs pyarrow (pip install pyarrow, "
                          f"or run `trtpd profile --from aiconfigurator` where aiconfigurator-core is installed)") from None
    return pq.read_table(path).to_pylist()


def _number(text: str):
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise linear through sorted xs, extended linearly beyond both ends (one point: constant)."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def _curve(points: dict[float, float]) -> tuple[list[float], list[float]]:
    xs = sorted(points)
    return xs, [points[x] for x in xs]


@dataclass
class AicSystem:
    """One system's operator tables for one framework, the newest version of each unless one is named."""

    root: Path
    system: str
    framework: str = "trtllm"
    version: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    _cache: dict = field(default_factory=dict)

    def _path(self, op: str, table: str) -> Path:
        return self._paths(op, table)[0]

    def _paths(self, op: str, table: str) -> list[Path]:
        """The table in every version that has it, the one to use first (the named version, else the newest)."""
        folder = self.root / self.system / op / self.framework
        if not folder.is_dir():
            have = ", ".join(sorted(p.name for p in self.root.iterdir() if p.is_dir()))
            raise ConfigError(f"AIConfigurator has no {op} data for {self.system}/{self.framework} "
                              f"(systems: {have})")
        found = sorted((v for v in folder.iterdir() if (v / f"{table}.parquet").exists() or (v / f"{table}.csv").exists()),
                       key=lambda v: _version_key(v.name))
        if not found:
            raise ConfigError(f"{folder}: no {table} table in any version")
        found.reverse()
        found.sort(key=lambda v: v.name != self.version)          # stable: the named version first
        self.versions.setdefault(op, found[0].name)
        return [v / f"{table}.parquet" for v in found]

    def rows(self, op: str, table: str) -> list[dict]:
        key = (op, table)
        if key not in self._cache:
            self._cache[key] = read_table(self._path(op, table))
        return self._cache[key]

    # -- operators, milliseconds -------------------------------------------------------------------
    def gemm_ms(self, m: int, n: int, k: int, dtype: str) -> float:
        key = ("gemm", dtype)
        if key not in self._cache:
            by_shape: dict[tuple[int, int], dict[float, float]] = {}
            for r in self.rows("gemm", "gemm_perf"):
                if r["gemm_dtype"] == dtype:
                    by_shape.setdefault((int(r["n"]), int(r["k"])), {})[float(r["m"])] = float(r["latency"])
            if not by_shape:
                raise ConfigError(f"AIConfigurator {self.system}: no {dtype} GEMMs")
            self._cache[key] = {s: _curve(p) for s, p in by_shape.items()}
        shapes = self._cache[key]
        if (n, k) in shapes:
            return interp(*shapes[(n, k)], m)
        near = min(shapes, key=lambda s: abs(math.log(s[0] / n)) + abs(math.log(s[1] / k)))
        return interp(*shapes[near], m) * (n * k) / (near[0] * near[1])

    def _attention(self, table: str, heads: tuple[int, int, int], kv_dtype: str) -> dict[int, tuple]:
        key = (table, heads, kv_dtype)
        if key not in self._cache:
            by_batch: dict[int, dict[float, float]] = {}
            for r in self.rows("attention", table):
                if (int(r["num_heads"]), int(r["num_key_value_heads"]), int(r["head_dim"])) != heads:
                    continue
                if r["kv_cache_dtype"] != kv_dtype or int(r["window_size"]) != 0 or r["attn_dtype"] != "bfloat16":
                    continue
                length = float(r["isl"]) + float(r["step"])
                by_batch.setdefault(int(r["batch_size"]), {})[length] = float(r["latency"])
            if not by_batch:
                raise ConfigError(f"AIConfigurator {self.system}: no {table} for heads/kv heads/head dim {heads} "
                                  f"with {kv_dtype} KV")
            self._cache[key] = {b: _curve(p) for b, p in by_batch.items()}
        return self._cache[key]

    def attention_ms(self, table: str, batch: int, length: float, heads: tuple[int, int, int], kv_dtype: str) -> float:
        curves = self._attention(table, heads, kv_dtype)
        batches = sorted(curves)
        return interp([float(b) for b in batches], [interp(*curves[b], length) for b in batches], batch)

    def mla_module_ms(self, phase: str, batch: int, length: float, heads: int, kv_dtype: str, gemm_dtype: str,
                      models: tuple[str, ...]) -> float:
        """DeepSeek's whole MLA attention block (projections, latent attention, output projection) on one
        device holding `heads` heads, measured as one module for a model (the first of `models` the table
        has): context (batch prompts of `length` tokens) or generation (batch sequences at context `length`)."""
        table = f"mla_{phase}_module_perf"
        key = (table, heads, kv_dtype, gemm_dtype, models)
        if key not in self._cache:
            rows = self.rows("mla", table)
            have = {r["model"] for r in rows}
            model = next((m for m in models if m in have), None)
            if model is None:
                raise ConfigError(f"AIConfigurator {self.system}: {table} measured {sorted(have)}, not {list(models)}")
            by_batch: dict[int, dict[float, float]] = {}
            for r in rows:
                if (r["model"], int(r["num_heads"]), r["kv_cache_dtype"], r["gemm_type"]) == \
                        (model, heads, kv_dtype, gemm_dtype):
                    x = float(r["isl"]) if phase == "context" else float(r["step"])
                    by_batch.setdefault(int(r["batch_size"]), {})[x] = float(r["latency"])
            if not by_batch:
                raise ConfigError(f"AIConfigurator {self.system}: no {table} for {heads} heads per device, "
                                  f"{kv_dtype} KV, {gemm_dtype} GEMMs")
            self._cache[key] = {b: _curve(p) for b, p in by_batch.items()}
        curves = self._cache[key]
        batches = sorted(curves)
        return interp([float(b) for b in batches], [interp(*curves[b], length) for b in batches], batch)

    def moe_ms(self, num_tokens: float, shape: tuple[int, int, int, int], moe_tp: int, moe_ep: int, dtype: str,
               distribution: str = "power_law_1.01") -> float:
        """The routed experts of one MoE layer for num_tokens tokens: shape = (hidden, expert intermediate,
        experts per token, experts); the newest version that measured this shape."""
        key = ("moe", shape, moe_tp, moe_ep, dtype, distribution)
        if key not in self._cache:
            points: dict[float, float] = {}
            for path in self._paths("moe", "moe_perf"):
                for r in read_table(path):
                    if (r["moe_dtype"], int(r["hidden_size"]), int(r["inter_size"]), int(r["topk"]),
                            int(r["num_experts"]), int(r["moe_tp_size"]), int(r["moe_ep_size"]),
                            r["distribution"]) == (dtype, *shape, moe_tp, moe_ep, distribution):
                        points[float(r["num_tokens"])] = float(r["latency"])
                if points:
                    self.versions["moe"] = path.parent.name
                    break
            if not points:
                raise ConfigError(f"AIConfigurator {self.system}: no {dtype} MoE data for hidden/intermediate/top-k/"
                                  f"experts {shape} at MoE TP {moe_tp} x EP {moe_ep} ({distribution})")
            self._cache[key] = _curve(points)
        return interp(*self._cache[key], num_tokens)

    def allreduce_ms(self, num_gpus: int, num_elements: float) -> float:
        if num_gpus <= 1:
            return 0.0
        key = ("allreduce", num_gpus)
        if key not in self._cache:
            points = {float(r["message_size"]): float(r["latency"]) for r in self.rows("comm", "custom_allreduce_perf")
                      if int(r["num_gpus"]) == num_gpus and r["allreduce_dtype"] == "bfloat16"}
            if not points:
                raise ConfigError(f"AIConfigurator {self.system}: no all-reduce data for {num_gpus} GPUs")
            self._cache[key] = _curve(points)
        return interp(*self._cache[key], num_elements)


def _version_key(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in name.replace("rc", ".rc.").replace("post", ".post.").split("."))


@dataclass(frozen=True)
class DenseLayerShapes:
    """One device's share of a dense GQA model at TP tp."""

    model: ModelSpec
    tp: int

    @property
    def heads(self) -> tuple[int, int, int]:
        m = self.model
        return m.num_heads // self.tp, max(1, m.num_kv_heads // self.tp), m.head_size

    def gemms(self) -> list[tuple[int, int]]:
        """(n, k) of the QKV, O, gate-up and down GEMMs."""
        m, t = self.model, self.tp
        h, d = m.hidden_size, m.head_size
        q, kv = m.num_heads * d // t, max(1, m.num_kv_heads // t) * d
        ffn = m.intermediate_size // t
        up = (m.mlp_matrices - 1) * ffn
        return [(q + 2 * kv, h), (h, q), (up, h), (h, ffn)]


class ComposedSteps:
    """Curve points from a composer's per-operator times in milliseconds (its context_ops_ms, decode_ops_ms)."""

    def context_s(self, batch_size: int, isl: int) -> float:
        return sum(self.context_ops_ms(batch_size, isl).values()) / 1e3

    def prefill_s(self, num_tokens: int) -> float:
        """The prefill curve's point: one sequence of num_tokens."""
        return self.context_s(1, num_tokens)

    def decode_step_s(self, batch_size: int, context_len: int) -> float:
        return sum(self.decode_ops_ms(batch_size, context_len).values()) / 1e3


class AicComposer(ComposedSteps):
    """Sums operator latencies into forward-pass latencies (seconds)."""

    def __init__(self, system: AicSystem, model: ModelSpec, tp: int, weight_dtype: str, kv_dtype: str) -> None:
        if model.is_moe or model.is_mla:
            raise ConfigError(f"{model.name}: AicComposer composes dense GQA/MHA models only (MLA + MoE models: "
                              f"AicMlaMoeComposer, through composer_for)")
        if weight_dtype not in GEMM_DTYPES or kv_dtype not in KV_DTYPES:
            raise ConfigError(f"weight dtype {weight_dtype!r} / KV dtype {kv_dtype!r}: use fp8, fp16 or bf16")
        self.system, self.model, self.tp = system, model, tp
        self.gemm_dtype, self.kv_dtype = GEMM_DTYPES[weight_dtype], KV_DTYPES[kv_dtype]
        self.shapes = DenseLayerShapes(model, tp)

    def _ops_ms(self, num_tokens: int, logits_rows: int, attention_ms: float) -> dict[str, float]:
        """One forward pass over num_tokens tokens, by operator (all layers), in milliseconds."""
        layers, dt = self.model.num_layers, self.gemm_dtype
        names = ("qkv_gemm", "proj_gemm", "gate_ffn1_gemm", "ffn2_gemm")
        ops = {name: layers * self.system.gemm_ms(num_tokens, n, k, dt)
               for name, (n, k) in zip(names, self.shapes.gemms())}
        ops["attention"] = layers * attention_ms
        ops["all_reduce"] = layers * 2 * self.system.allreduce_ms(self.tp, num_tokens * self.model.hidden_size)
        # the LM head stays bf16 in fp8 checkpoints (TensorRT-LLM's FP8 recipes leave lm_head unquantized, and
        # AIConfigurator models it so)
        ops["logits_gemm"] = self.system.gemm_ms(logits_rows, self.model.vocab_size // self.tp, self.model.hidden_size,
                                                 "bfloat16")
        return ops

    def context_ops_ms(self, batch_size: int, isl: int) -> dict[str, float]:
        """A context pass of batch_size prompts of isl tokens each (GEMMs at batch x isl rows, attention over
        batch_size sequences, one logits row per prompt)."""
        attn = self.system.attention_ms("context_attention_perf", batch_size, isl, self.shapes.heads, self.kv_dtype)
        return self._ops_ms(batch_size * isl, batch_size, attn)

    def decode_ops_ms(self, batch_size: int, context_len: int) -> dict[str, float]:
        """A decode step of batch_size sequences at context_len tokens each."""
        attn = self.system.attention_ms("generation_attention_perf", batch_size, context_len, self.shapes.heads,
                                        self.kv_dtype)
        return self._ops_ms(batch_size, batch_size, attn)

    @property
    def backend(self) -> str:
        v = self.system.versions
        return (f"aiconfigurator {self.system.system} {self.system.framework} (gemm {v.get('gemm')}, attention "
                f"{v.get('attention')}, all-reduce {v.get('comm', '-')}), {self.gemm_dtype} GEMMs")


def composer_for(system: AicSystem, model: ModelSpec, tp: int, weight_dtype: str, kv_dtype: str):
    """AicComposer for dense GQA/MHA models, AicMlaMoeComposer (trtpd/perf/aic_deepseek.py) for MLA + MoE."""
    if model.is_mla and model.is_moe:
        from trtpd.perf.aic_deepseek import AicMlaMoeComposer
        return AicMlaMoeComposer(system, model, tp, weight_dtype, kv_dtype)
    return AicComposer(system, model, tp, weight_dtype, kv_dtype)


def profile_from_aiconfigurator(system: AicSystem, model: ModelSpec, tp: int, weight_dtype: str, kv_dtype: str,
                                measured_at: str = "") -> MeasuredProfile:
    c = composer_for(system, model, tp, weight_dtype, kv_dtype)
    prefill = PrefillCurve(num_tokens=list(PREFILL_TOKENS), latency_s=[c.prefill_s(t) for t in PREFILL_TOKENS])
    decode = DecodeGrid(batch_sizes=list(DECODE_BATCHES), context_lens=list(DECODE_CONTEXTS),
                        step_latency_s=[[c.decode_step_s(b, ctx) for ctx in DECODE_CONTEXTS] for b in DECODE_BATCHES])
    return MeasuredProfile(model=model.name, tp=tp, kv_dtype=kv_dtype, backend=c.backend, measured_at=measured_at,
                           host=f"AIConfigurator database ({system.system})", prefill=prefill, decode=decode)
