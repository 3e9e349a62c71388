#!/usr/bin/env bash
# Creates .venv (if missing) and installs trtpd with its pinned, CPU-only dependencies.
# Idempotent: a second run only checks that the install is complete.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.trtpd-installed
want=$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing trtpd and its dependencies (torch 2.13.0 CPU, nvidia-pytriton 0.7.0, tritonclient)"
  .venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "is ignored" || true
  # torch first, alone: pip takes the local CPU wheel for ==2.13.0 instead of a multi-GB CUDA build.
  .venv/bin/python -m pip install --quiet "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -m pip install --quiet -e ".[dev]" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import torch, tritonclient.grpc, pytriton, trtpd" 
  echo "$want" > "$stamp"
fi
# The simulator's hot modules compiled with Cython (trtpd.accel: the same results, about 1.5x faster; without
# them every module is the Python source). Rebuilt only when a source changed since the last build.
.venv/bin/trtpd accel build || echo "[setup] WARNING: the simulator's modules did not compile; they run as" \
  "Python (the same results, slower)"
# Debian's prometheus package (Prometheus 2.42 + promtool) for trtpd.observability and its tests. Only the
# binaries are wanted: policy-rc.d keeps apt from starting the Debian service. Without apt or root, say so and
# go on (the Prometheus tests then fail, naming /usr/bin/prometheus).
if [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/bin/promtool ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian's prometheus package (apt-get)"
    own_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
    fi
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends prometheus >/dev/null; } 2>&1 | grep -vE "^debconf|invoke-rc.d|policy-rc.d|^$" || true
    [ -n "$own_policy" ] && rm -f /usr/sbin/policy-rc.d
    [ -x /usr/bin/prometheus ] || echo "[setup] WARNING: apt-get could not install prometheus; /usr/bin/prometheus is missing (the Prometheus tests will fail)"
  else
    echo "[setup] WARNING: /usr/bin/prometheus is missing and apt-get is not usable here (need root + apt);" \
         "install Debian's prometheus package by hand (the Prometheus tests will fail without it)"
  fi
fi
# NVIDIA's aiperf (HTTP load against the gateway's OpenAI API), for its one e2e test: in a venv of its own,
# because it pulls ~80 packages (transformers, pandas, dash, ...) and would move versions in .venv.
if [ "${TRTPD_SETUP_AIPERF:-0}" = 1 ] && [ ! -x .venv-aiperf/bin/aiperf ]; then
  echo "[setup] installing aiperf 0.13.0 into .venv-aiperf (about a minute)"
  "$PY" -m venv .venv-aiperf
  .venv-aiperf/bin/python -m pip install --quiet "aiperf==0.13.0" 2>&1 | grep -v "is ignored" || true
  [ -x .venv-aiperf/bin/aiperf ] || echo "[setup] WARNING: aiperf did not install; its e2e test will fail"
fi
# NVIDIA's AIConfigurator (its measured per-operator database, and its own `aiconfigurator cli` answer that
# benchmarks/aic_reproduce.py and tests/unit/perf/test_aiconfigurator_db.py compare trtpd against): in a venv of
# its own, because it needs numpy >= 2.1 and .venv pins numpy < 2 (pytriton). aiconfigurator-core carries the
# database (~80 MB of parquet); the aiconfigurator package carries the CLI and reads the core's database. (Its
# `cli estimate` points to aisimulate==0.12.0 as its future home; that is an sdist whose build fails here.)
aic_pins="aiconfigurator==0.12.0 aiconfigurator-core==0.12.0"
if [ "${TRTPD_SETUP_AIC:-0}" = 1 ] && [ "$(cat .venv-aic/.trtpd-aic 2>/dev/null)" != "$aic_pins" ]; then
  echo "[setup] installing $aic_pins into .venv-aic (about a minute)"
  [ -x .venv-aic/bin/python ] || "$PY" -m venv .venv-aic
  # shellcheck disable=SC2086
  .venv-aic/bin/python -m pip install --quiet $aic_pins 2>&1 | grep -v "is ignored" || true
  if [ -x .venv-aic/bin/aiconfigurator ] && .venv-aic/bin/python -c "import aiconfigurator_core, pyarrow" 2>/dev/null; then
    echo "$aic_pins" > .venv-aic/.trtpd-aic
  else
    echo "[setup] WARNING: AIConfigurator did not install into .venv-aic; its tests and benchmarks/aic_reproduce.py will fail"
  fi
fi
echo "[setup] ready: .venv ($(.venv/bin/python -c 'import torch;print("torch", torch.__version__)'))"
