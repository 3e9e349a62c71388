#!/usr/bin/env bash
# Set up, then run the whole test suite (unit, integration and end-to-end tiers).
set -euo pipefail
cd "$(dirname "$0")/.."
TRTPD_SETUP_AIPERF=1 TRTPD_SETUP_AIC=1 scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
