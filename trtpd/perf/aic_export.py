"""Exports AIConfigurator's operator tables from parquet to CSV, for a trtpd environment without pyarrow.

Runs in AIConfigurator's own environment (.venv-aic: aiconfigurator-core and pyarrow, numpy >= 2), as a
script, importing nothing from trtpd (trtpd's .venv pins numpy < 2, so the two cannot share one):

    .venv-aic/bin/python trtpd/perf/aic_export.py --system h200_sxm --out /tmp/aic-csv

writes <out>/<system>/<op>/<framework>/<version>/<table>.csv for every version of the tables the
AIConfigurator source reads (GEMMs, context and generation attention, custom all-reduce; DeepSeek's MLA
modules and the MoE experts; --ops gemm,attention,comm for the dense models' alone), the same layout
as the database, so trtpd.perf.aiconfigurator.database_root(<out>) reads it. Every row and column is
kept; numbers are written with repr(), which round-trips a float64 exactly. Prints one JSON line:
{"root": <installed database>, "out": <out>, "tables": {<relative path>: rows}}.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
from pathlib import Path

TABLES = (("gemm", "gemm_perf"), ("attention", "context_attention_perf"),
          ("attention", "generation_attention_perf"), ("comm", "custom_allreduce_perf"),
          ("mla", "mla_context_module_perf"), ("mla", "mla_generation_module_perf"), ("moe", "moe_perf"))


def installed_root() -> Path:
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("aiconfigurator_core is not installed in this Python (run TRTPD_SETUP_AIC=1 scripts/setup.sh)")
    return Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"


def export(root: Path, system: str, framework: str, out: Path, ops: set[str] | None = None) -> dict[str, int]:
    import pyarrow.parquet as pq
    written: dict[str, int] = {}
    for op, table in TABLES:
        if ops is not None and op not in ops:
            continue
        folder = root / system / op / framework
        for parquet in sorted(folder.glob(f"*/{table}.parquet")) if folder.is_dir() else ():
            rel = parquet.relative_to(root).with_suffix(".csv")
            rows = pq.read_table(parquet).to_pylist()
            if not rows:
                continue
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with dest.open("w", newline="") as f:
                w = csv.writer(f)
                names = list(rows[0])
                w.writerow(names)
                for r in rows:
                    w.writerow([repr(r[n]) if isinstance(r[n], float) else r[n] for n in names])
            written[str(rel)] = len(rows)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", required=True, help="e.g. h200_sxm, h100_sxm")
    p.add_argument("--framework", default="trtllm")
    p.add_argument("--root", type=Path, default=None, help="systems/data folder (default: the installed one)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ops", default=None, help="comma-separated operator folders to export (default: all of "
                                               f"{', '.join(sorted({op for op, _ in TABLES}))})")
    a = p.parse_args(argv)
    root = a.root or installed_root()
    if not (root / a.system).is_dir():
        sys.exit(f"{root}: no system {a.system!r} (have: {', '.join(sorted(q.name for q in root.iterdir()))})")
    tables = export(root, a.system, a.framework, a.out, set(a.ops.split(",")) if a.ops else None)
    if not tables:
        sys.exit(f"{root / a.system}: none of the tables {[t for _, t in TABLES]} for {a.framework}")
    print(json.dumps({"root": str(root), "out": str(a.out), "tables": tables}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
