#!/usr/bin/env bash
# The GPU lane in one offline command; everything is in scripts/device_check.py (its docstring says what runs).
#   bash scripts/device_check.sh                # on the lent GPU machine: full, under 8 minutes
#   bash scripts/device_check.sh --quick        # under 4 minutes
#   bash scripts/device_check.sh --cpu-dry-run  # the same flow on a CPU machine (--backend cpu, pip index off)
#   bash scripts/device_check.sh --print-plan   # what would run, with which time boxes; runs nothing
# Before: bash scripts/device_bundle.sh (here, with the package index) and carry .device/wheels and .device/peers.
# MUSA: chosen when torch_musa imports and mcc is found; that flow has not been tried on a MUSA machine.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/device_check.py "$@"
