#!/usr/bin/env bash
# Installs mtmegatron and what it needs, on a fresh machine or into the environment you are in.
# Where: $PYTHON if set, else the active venv/conda env, else python3. When that python refuses installs
# (a distribution python marked EXTERNALLY-MANAGED, PEP 668, and no venv active) a project venv is created in
# .venv (MTMEGATRON_VENV=dir) and used; then `torchrun` and `mtmegatron` are linked into ~/.local/bin when no
# torchrun is on PATH and ~/.local/bin is (so `torchrun --nproc_per_node 2 -m mtmegatron.pretrain` works as
# written), otherwise the script ends with the `source .venv/bin/activate` line to run.
# torch first, and only if none is installed (a CUDA torch, or the torch of a torch_musa 2.11/2.9/2.7.1, is kept):
# torch==2.13.0, CPU build from https://download.pytorch.org/whl/cpu when `nvidia-smi -L` lists no GPU, the
# default (CUDA) build when it does; a pip configuration that names an index or find-links
# (pip config / PIP_INDEX_URL / PIP_FIND_LINKS) is trusted to choose instead (MTMEGATRON_TORCH_INDEX=url forces one).
# CMake >= 3.24 (CMakeLists.txt) and ninja are installed through pip when missing or too old. The extension is
# then built against that torch with --no-build-isolation, so pip never pulls a second (multi-GB) torch.
# Where torch_musa is installed the `musa` extra (torchada, which the MUSA bridge needs) comes too: without it
# auto-detect stops with an error rather than training on the CPU. Where torch_musa is installed and `mcc` is found
# (on PATH or in $MUSA_HOME/bin), the MUSA kernels are built too (python -m mtmegatron.ops.musa_build, with
# TORCH_MUSA_ARCH_LIST if you set it); MTMEGATRON_BUILD_MUSA=0 skips that, =1 insists (an error when mcc or
# torch_musa is missing). A failed MUSA build stops the script with its output.
# MTMEGATRON_INSTALL_DRY_RUN=1 prints the decisions and commands instead of running them (tests use it; there
# MTMEGATRON_INSTALL_ASSUME_PEP668=1 stands in for a distribution python).
set -euo pipefail
cd "$(dirname "$0")/.."
CPU_INDEX=https://download.pytorch.org/whl/cpu
CMAKE_MIN=3.24
VENV=${MTMEGATRON_VENV:-.venv}
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then PY=$VIRTUAL_ENV/bin/python
else PY=python3
fi

run() {
  if [[ -n "${MTMEGATRON_INSTALL_DRY_RUN:-}" ]]; then echo "+ $*"; else "$@"; fi
}

externally_managed() {  # PEP 668: the interpreter's stdlib carries EXTERNALLY-MANAGED and it is not a venv
  [[ -n "${MTMEGATRON_INSTALL_ASSUME_PEP668:-}" ]] && return 0
  "$PY" -c 'import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if os.path.isfile(marker) and sys.prefix == sys.base_prefix else 1)'
}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU "; }

pip_chooses_index() {
  [[ -n "${PIP_INDEX_URL:-}${PIP_FIND_LINKS:-}${PIP_EXTRA_INDEX_URL:-}" ]] && return 0
  "$PY" -m pip config list 2>/dev/null | grep -qE '(index-url|find-links)='
}

VENV_CREATED=
if externally_managed; then
  echo "[install] $PY is managed by the distribution (PEP 668): using a project venv in $VENV"
  if [[ ! -x "$VENV/bin/python" ]]; then
    run "$PY" -m venv "$VENV" || { echo "[install] error: cannot create $VENV (Debian/Ubuntu: apt install python3-venv)" >&2; exit 1; }
  fi
  PY=$VENV/bin/python
  VENV_CREATED=1
fi

if ! "$PY" -c "import torch" 2>/dev/null; then
  if [[ -n "${MTMEGATRON_TORCH_INDEX:-}" ]]; then
    echo "[install] no torch found: installing torch==2.13.0 from $MTMEGATRON_TORCH_INDEX"
    run "$PY" -m pip install --quiet "torch==2.13.0" --index-url "$MTMEGATRON_TORCH_INDEX"
  elif has_gpu; then
    echo "[install] no torch found, nvidia-smi lists a GPU: installing torch==2.13.0 (CUDA build)"
    run "$PY" -m pip install --quiet "torch==2.13.0"
  elif pip_chooses_index; then
    echo "[install] no torch found, no GPU: installing torch==2.13.0 from the index your pip configuration names"
    run "$PY" -m pip install --quiet "torch==2.13.0"
  else
    echo "[install] no torch found, no GPU: installing torch==2.13.0 (CPU build from $CPU_INDEX)"
    run "$PY" -m pip install --quiet "torch==2.13.0" --index-url "$CPU_INDEX"
  fi
fi
# torch_musa "installed" means what the musa backend means by it: findable (importing it may need the driver).
EXTRAS=test
HAS_TORCH_MUSA=
if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch_musa') is None)" 2>/dev/null; then
  EXTRAS=test,musa
  HAS_TORCH_MUSA=1
  echo "[install] torch_musa found: adding the musa extra (torchada)"
fi
MCC=$(command -v mcc 2>/dev/null || true)
if [[ -z "$MCC" && -n "${MUSA_HOME:-}" && -x "$MUSA_HOME/bin/mcc" ]]; then MCC=$MUSA_HOME/bin/mcc; fi
BUILD_MUSA=
case "${MTMEGATRON_BUILD_MUSA:-}" in
  0) ;;
  1) if [[ -z "$HAS_TORCH_MUSA" || -z "$MCC" ]]; then
       echo "[install] error: MTMEGATRON_BUILD_MUSA=1 but ${HAS_TORCH_MUSA:+mcc (MUSA_HOME/bin or PATH)}${HAS_TORCH_MUSA:-torch_musa} is missing" >&2
       exit 1
     fi
     BUILD_MUSA=1 ;;
  "") [[ -n "$HAS_TORCH_MUSA" && -n "$MCC" ]] && BUILD_MUSA=1 ;;
  *) echo "[install] error: MTMEGATRON_BUILD_MUSA=${MTMEGATRON_BUILD_MUSA} (expected 0 or 1)" >&2; exit 1 ;;
esac
BUILD_TOOLS=("scikit-build-core>=0.10" "pybind11>=2.12")
cmake_version=$(cmake --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+' | head -1 || true)
if [[ -z "$cmake_version" ]] || ! printf '%s\n%s\n' "$CMAKE_MIN" "$cmake_version" | sort -C -V; then
  echo "[install] CMake ${cmake_version:-not found} (need >= $CMAKE_MIN): installing cmake through pip"
  BUILD_TOOLS+=("cmake>=$CMAKE_MIN")
fi
if ! command -v ninja >/dev/null 2>&1; then
  echo "[install] ninja not found: installing it through pip"
  BUILD_TOOLS+=(ninja)
fi
run "$PY" -m pip install --quiet "${BUILD_TOOLS[@]}"
echo "[install] building and installing mtmegatron[$EXTRAS] (editable) against torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '(to be installed)')"
run "$PY" -m pip install --quiet --no-build-isolation -e ".[$EXTRAS]"
if [[ -n "$BUILD_MUSA" ]]; then
  echo "[install] mcc ($MCC) and torch_musa found: building the MUSA kernels (TORCH_MUSA_ARCH_LIST=${TORCH_MUSA_ARCH_LIST:-unset, the torch_musa default}; MTMEGATRON_BUILD_MUSA=0 skips)"
  run "$PY" -m mtmegatron.ops.musa_build || { echo "[install] error: the MUSA kernel build failed (output above); MTMEGATRON_BUILD_MUSA=0 installs without it" >&2; exit 1; }
elif [[ -n "$HAS_TORCH_MUSA" && "${MTMEGATRON_BUILD_MUSA:-}" != 0 ]]; then
  echo "[install] torch_musa found but no mcc (PATH or \$MUSA_HOME/bin): the MUSA kernels are not built (the ops' PyTorch versions run)"
fi
run "$PY" -m mtmegatron.cli env

if [[ -n "$VENV_CREATED" ]]; then
  if [[ $VENV == /* ]]; then bin=$VENV/bin; else bin=$PWD/$VENV/bin; fi
  if ! command -v torchrun >/dev/null 2>&1 && [[ ":$PATH:" == *":$HOME/.local/bin:"* ]]; then
    echo "[install] linking torchrun and mtmegatron from $VENV into ~/.local/bin (no other torchrun on PATH)"
    run mkdir -p "$HOME/.local/bin"
    run ln -sf "$bin/torchrun" "$HOME/.local/bin/torchrun"
    run ln -sf "$bin/mtmegatron" "$HOME/.local/bin/mtmegatron"
  else
    echo "[install] installed into $VENV: run 'source $VENV/bin/activate' before torchrun"
  fi
fi
