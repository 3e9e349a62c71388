"""`trtpd --help`, `plan`, `simulate`, `lint`, `build --dry-run` never import torch (it costs ~1.5 s of start-up)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Runs the CLI in a fresh interpreter and prints, after it exits, which heavy modules it imported.
PROBE = """
import sys
from trtpd.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("torch", "pytriton", "safetensors", "tritonclient") if m in sys.modules)
print("HEAVY", ",".join(heavy) or "-", "EXIT", code, file=sys.stderr)
"""

COMMANDS = [
    ["--help"],
    ["--version"],
    ["plan", "--help"],
    ["plan", "--rate-per-s", "5", "--no-verify"],
    ["plan", "--method", "seed004", "--tokens-per-min", "5e6"],
    ["simulate", "--rate-per-s", "2", "--num-requests", "200", "--mode", "disaggregated"],
    ["lint", "--list-rules"],
    ["build", "--model", "llama-2-70b", "--dry-run"],
    ["build", "--backend", "reference", "--model", "tiny-llama", "--dry-run"],
    ["plan", "--attainment", "90"],
]


def heavy_modules(argv: list[str], cwd) -> tuple[list[str], int]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=cwd, timeout=120)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("HEAVY ")][-1]
    _, heavy, _, code = line.split()
    return ([] if heavy == "-" else heavy.split(",")), int(code or 0)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_command_does_not_import_torch(argv, tmp_path):
    heavy, code = heavy_modules(argv, tmp_path)
    assert "torch" not in heavy, f"trtpd {' '.join(argv)} imported {heavy}"
    assert "pytriton" not in heavy and "safetensors" not in heavy
    assert code in (0, 2)


def test_help_imports_nothing_heavy(tmp_path):
    assert heavy_modules(["--help"], tmp_path) == ([], 0)
    assert heavy_modules(["plan", "--help"], tmp_path) == ([], 0)


def test_the_probe_sees_torch_when_it_is_imported(tmp_path):
    """The probe can fail: with torch imported before the CLI runs, it reports torch."""
    proc = subprocess.run([sys.executable, "-c", "import torch, sys; " + PROBE.replace("import sys\n", ""),
                           "--version"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "HEAVY torch" in proc.stderr


def test_a_command_loads_only_its_own_module(tmp_path):
    """`trtpd plan ...` builds only plan's parser: no other command's module (status pulls in urllib and
    http.client, about 30 ms); `trtpd --help` and an unknown command still see every command."""
    probe = ("import sys\nfrom trtpd.cli.main import build_parser, main\n"
             "main(sys.argv[1:]) if sys.argv[1:] else build_parser()\n"
             "print('CLI', ','.join(sorted(m for m in sys.modules if m.startswith('trtpd.cli.'))), file=sys.stderr)\n")

    def cli_modules(*argv: str) -> set[str]:
        proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=tmp_path,
                              timeout=120)
        return set([ln for ln in proc.stderr.splitlines() if ln.startswith("CLI ")][-1].split()[1].split(","))
    own = cli_modules("plan", "--method", "seed004", "--tokens-per-min", "5e6")
    assert "trtpd.cli.plan" in own and not own & {"trtpd.cli.status", "trtpd.cli.up", "trtpd.cli.build"}, own
    assert {"trtpd.cli.plan", "trtpd.cli.status", "trtpd.cli.build"} <= cli_modules()


def test_the_quick_exit_keeps_every_line_the_file_and_the_status(tmp_path, capsys):
    """`trtpd plan` ends without the interpreter's teardown (trtpd.cli.main.entry): what it printed into a pipe
    (block-buffered) is what main() prints in process, the file it wrote is whole, and its exit status is
    plan's own (3: infeasible)."""
    import os

    from trtpd.cli.main import main
    from trtpd.schema.plan import load_plan

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}   # stdout block-buffered, as usual
    out = tmp_path / "plan.yaml"
    argv = ["plan", "--rate-per-s", "5", "--no-verify", "--no-colocated", "-o", str(out)]
    proc = subprocess.run([sys.executable, "-m", "trtpd.cli.main", *argv], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith(f"wrote {out}") and load_plan(out).feasible
    infeasible = ["plan", "--rate-per-s", "5", "--tpot-s", "0.0001", "--no-verify", "--yaml"]
    proc = subprocess.run([sys.executable, "-m", "trtpd.cli.main", *infeasible], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=env)
    assert main(infeasible) == 3 and proc.returncode == 3
    assert proc.stdout == capsys.readouterr().out and "binding_constraint: tpot" in proc.stdout
