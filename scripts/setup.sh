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
echo "[setup] ready: .venv ($(.venv/bin/python -c 'import torch;print("torch", torch.__version__)'))"
