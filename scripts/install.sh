#!/usr/bin/env bash
# Installs mtmegatron and what it needs into the current Python environment.
# torch first, and only if none is installed: CI and CPU boxes get torch==2.13.0 (CPU); a machine that already
# has a CUDA torch, or torch 2.7.1 + torch_musa, keeps it. The extension is then built against that torch
# with --no-build-isolation, so pip never pulls a second (multi-GB) torch into a build environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[install] no torch found: installing torch==2.13.0"
  "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet "scikit-build-core>=0.10" "pybind11>=2.12" ninja
echo "[install] building and installing mtmegatron (editable) against torch $("$PY" -c 'import torch; print(torch.__version__)')"
"$PY" -m pip install --quiet --no-build-isolation -e ".[test]"
"$PY" -m mtmegatron.cli env
