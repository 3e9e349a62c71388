#!/usr/bin/env bash
# The main job: set up, build the reference engines, run disaggregated vs colocated on this CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/trtpd demo "$@"
