#!/usr/bin/env bash
# Installs mtmegatron and what it needs into the current Python environment.
# torch first, and only if none is installed: CI and CPU boxes get torch==2.13.0 (CPU); a machine that already
# has a CUDA torch, or torch 2.7.1 + torch_musa, keeps it. The extension is then built against that torch
# with --no-build-isolation, so pip never pulls a second (multi-GB) torch into a build environment.
# Where torch_musa is installed the `musa` extra (torchada, which the MUSA bridge needs) comes too: without it
# auto-detect stops with an error rather than training on the CPU.
# MTMEGATRON_INSTALL_DRY_RUN=1 prints the commands instead of running them (tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

run() {
  if [[ -n "${MTMEGATRON_INSTALL_DRY_RUN:-}" ]]; then echo "+ $*"; else "$@"; fi
}

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[install] no torch found: installing torch==2.13.0"
  run "$PY" -m pip install --quiet "torch==2.13.0"
fi
# torch_musa "installed" means what the musa backend means by it: findable (importing it may need the driver).
EXTRAS=test
if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch_musa') is None)" 2>/dev/null; then
  EXTRAS=test,musa
  echo "[install] torch_musa found: adding the musa extra (torchada)"
fi
run "$PY" -m pip install --quiet "scikit-build-core>=0.10" "pybind11>=2.12" ninja
echo "[install] building and installing mtmegatron[$EXTRAS] (editable) against torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '(to be installed)')"
run "$PY" -m pip install --quiet --no-build-isolation -e ".[$EXTRAS]"
run "$PY" -m mtmegatron.cli env
