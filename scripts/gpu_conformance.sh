#!/usr/bin/env bash
# The GPU lane, on a machine with a device: (1) the GPU-marked backend conformance tests (tests/conformance,
# `-m gpu`), then (2) scripts/gpu_train_check.py: tiny Llama-3/Mixtral/DeepSeek-V3 training on the device
# (fp32 and bf16; TP2 with >= 2 devices) compared with the CPU backend, the fused kernels vs their CPU reference,
# and FP8 with each executor that imports. Exit status is non-zero when either part fails.
#
#   scripts/gpu_conformance.sh                 # requires the cuda backend; extra args go to pytest
#   MTMEGATRON_REQUIRE_BACKENDS=musa scripts/gpu_conformance.sh
#   GPU_TRAIN_CHECK_ARGS="--train-iters 10 --skip-fp8" scripts/gpu_conformance.sh
#
# Needs: a CUDA (or torch_musa) build of torch, megatron-core 0.16.x and mtmegatron installed
# (`pip install --no-build-isolation -e .`). On a lent machine with no network, scripts/device_check.sh does the
# install and build from carried wheels and runs both parts (each time-boxed) plus the step benchmark. MTMEGATRON_REQUIRE_BACKENDS makes collection fail, instead of
# deselecting the tests, when a required backend is unavailable, so a missing GPU cannot pass silently.
# Multi-rank tests need one device per rank (NCCL); with fewer devices they are skipped and `-rs` says so.
set -euo pipefail
cd "$(dirname "$0")/.."

export MTMEGATRON_REQUIRE_BACKENDS="${MTMEGATRON_REQUIRE_BACKENDS:-cuda}"

if ! python -c "import mtmegatron.backends, megatron.core" 2>/dev/null; then
    echo "gpu_conformance: cannot import mtmegatron.backends and megatron.core;" >&2
    echo "  pip install 'megatron-core>=0.16,<0.17' && pip install --no-build-isolation -e ." >&2
    exit 2
fi
python - <<'PY'
import torch
print(f"torch {torch.__version__}, cuda {torch.version.cuda}, devices {torch.cuda.device_count()}")
PY

status=0
python -m pytest -m gpu tests/conformance -p no:cacheprovider -rs -v "$@" || status=$?
backend="${MTMEGATRON_REQUIRE_BACKENDS%%,*}"
# shellcheck disable=SC2086  # GPU_TRAIN_CHECK_ARGS is a list of flags
python scripts/gpu_train_check.py --backend-under-test "$backend" ${GPU_TRAIN_CHECK_ARGS:-} || status=$((status ? status : $?))
echo "gpu_conformance: exit status $status (pytest first, then gpu_train_check.py)"
exit "$status"
