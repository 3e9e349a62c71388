"""trtpd installed from its wheel, run outside the checkout: configs, recipes and templates come from the package.

The wheel is built from this checkout and installed (--no-deps) into a fresh venv. That venv sees the main
venv's dependencies (torch, tritonclient, ...) through a .pth file, not through --system-site-packages, so
nothing is downloaded. Every command runs from an empty temporary directory with PYTHONPATH unset.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout_s: float = 120):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


def _build_wheel(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True)
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out_dir),
                 str(CHECKOUT)], cwd=out_dir)
    assert proc.returncode == 0, f"building the wheel failed (is hatchling installed? pip install -e '.[dev]'):\n" \
                                 f"{proc.stdout}{proc.stderr}"
    (wheel,) = out_dir.glob("trtpd-*.whl")
    return wheel


def _make_venv(root: Path, wheel: Path) -> Path:
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(root)
    python = root / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=root).stdout.strip())
    (site / "main-venv-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root / "bin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """bin/ of a fresh venv with trtpd installed from its wheel."""
    root = tmp_path_factory.mktemp("installed")
    wheel = _build_wheel(root / "dist")
    bin_dir = _make_venv(root / "venv", wheel)
    yield bin_dir
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def empty_dir(tmp_path) -> Path:
    d = tmp_path / "elsewhere"
    d.mkdir()
    return d


def outside_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRTPD_HOME")}
    return {**env, **extra}


def trtpd(bin_dir: Path, cwd: Path, *argv: str, env: dict[str, str] | None = None, timeout_s: float = 120):
    return _run([str(bin_dir / "trtpd"), *argv], cwd=cwd, env=env or outside_env(), timeout_s=timeout_s)


@pytest.mark.integration
def test_the_installed_package_is_the_wheel_not_the_checkout(installed, empty_dir):
    probe = ("import trtpd, trtpd.resources as r; print(trtpd.__file__); "
             "print(r.configs_dir('hardware')); print(r.recipes_dir()); print(r.templates_dir())")
    proc = _run([str(installed / "python"), "-c", probe], cwd=empty_dir, env=outside_env())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    venv_root = str(installed.parent)
    assert all(line.startswith(venv_root) for line in lines), lines
    assert lines[1].endswith("trtpd/configs/hardware") and lines[2].endswith("trtpd/recipes/tensorrtllm")
    assert lines[3].endswith("trtpd/triton_models")


@pytest.mark.integration
def test_help_and_version(installed, empty_dir):
    proc = trtpd(installed, empty_dir, "--help")
    assert proc.returncode == 0 and "plan" in proc.stdout and "build" in proc.stdout
    proc = trtpd(installed, empty_dir, "--version")
    assert proc.returncode == 0 and proc.stdout.startswith("trtpd ")


@pytest.mark.integration
def test_plan_with_the_packaged_hardware_workload_and_slo(installed, empty_dir):
    proc = trtpd(installed, empty_dir, "plan", "--rate-per-s", "5", "--verify-requests", "500")
    assert proc.returncode == 0, proc.stderr
    assert "llama-2-70b on h100-sxm, chat-powerlaw" in proc.stdout
    assert "TTFT <= 500.0 ms and TPOT <= 50.0 ms for 90% of requests" in proc.stdout
    proc = trtpd(installed, empty_dir, "plan", "--rate-per-s", "5", "--no-verify", "--hardware", "h200",
                 "--workload", "seed004", "--slo", "seed004")
    assert proc.returncode == 0, proc.stderr
    assert list(empty_dir.iterdir()) == []


@pytest.mark.integration
def test_build_dry_run_and_configs_only_with_the_packaged_recipes_and_templates(installed, empty_dir):
    proc = trtpd(installed, empty_dir, "build", "--model", "llama-2-70b", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("trtllm-build --checkpoint_dir") == 2
    assert "dry run: nothing was written" in proc.stdout
    assert list(empty_dir.iterdir()) == []
    proc = trtpd(installed, empty_dir, "build", "--model", "llama-3.1-8b", "--configs-only")
    assert proc.returncode == 0, proc.stderr
    deploy = empty_dir / "engines" / "llama-3.1-8b" / "deploy"
    assert (deploy / "trtllm-serve" / "disagg.yaml").is_file()
    assert len(list(deploy.rglob("config.pbtxt"))) >= 3


@pytest.mark.integration
def test_unknown_config_names_list_the_packaged_ones(installed, empty_dir):
    proc = trtpd(installed, empty_dir, "plan", "--rate-per-s", "5", "--hardware", "nope")
    assert proc.returncode == 2
    packaged = ", ".join(sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "configs" / "hardware")
                                .glob("*.yaml")))   # what the wheel must carry (force-include of configs/)
    assert "h100-sxm" in packaged and "cpu-reference" in packaged
    assert proc.stderr.splitlines() == [f"trtpd plan: error: unknown hardware 'nope'; known: {packaged} "
                                        f"(or pass a path to a YAML file)"]


@pytest.mark.e2e
def test_up_status_down_from_the_installed_wheel(installed, empty_dir):
    env = outside_env(TRTPD_HOME=str(empty_dir / "home"))
    engines = empty_dir / "engines"
    proc = trtpd(installed, empty_dir, "build", "--backend", "reference", "--model", "tiny-llama",
                 "--engines-dir", str(engines), env=env, timeout_s=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        proc = trtpd(installed, empty_dir, "up", "--name", "wheel", "--engines-dir", str(engines), env=env,
                     timeout_s=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "ready: wheel (disaggregated)" in proc.stdout
        proc = trtpd(installed, empty_dir, "status", env=env)
        assert proc.returncode == 0, proc.stderr
        assert "wheel" in proc.stdout and "ready" in proc.stdout
    finally:
        down = trtpd(installed, empty_dir, "down", "--all", env=env, timeout_s=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped wheel" in down.stdout
