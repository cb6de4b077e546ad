#!/usr/bin/env bash
# Run a command on the simulated MUSA device (tests only): builds the simulator extension if the cache has
# none, puts the stand-in torch_musa (tests/musa_sim/site) first on PYTHONPATH, and execs the command.
# Real torchada must be installed: it runs on top of the stand-in exactly as on a MUSA machine.
#   bash scripts/musa_sim.sh torchrun --nproc_per_node 2 -m mtmegatron.pretrain --backend musa --mock-data --train-iters 5
# Env: MUSA_SIM_DEVICE_COUNT (default 8), MUSA_VISIBLE_DEVICES, MUSA_SIM_STATS_DIR (per-process JSON stats),
#      MUSA_SIM_CACHE (build cache, default ~/.cache/mtmegatron/musa_sim), PYTHON (default python3).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
if [ "$#" -eq 0 ]; then
  echo "usage: scripts/musa_sim.sh <command...>" >&2
  exit 2
fi
if ! "$python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torchada') is None)"; then
  echo "musa_sim: torchada is not installed; the simulated MUSA device runs under the real adapter: pip install torchada" >&2
  exit 1
fi
MUSA_SIM_EXT="$("$python" "$repo/tests/musa_sim/build.py")"
export MUSA_SIM_EXT
export MUSA_SIM_DEVICE_COUNT="${MUSA_SIM_DEVICE_COUNT:-8}"
export PYTHONPATH="$repo/tests/musa_sim/site${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
