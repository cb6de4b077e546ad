#!/usr/bin/env bash
# The CUDA twin of dist_run_pretrain_megatron_llama3_musa.sh: same defaults, NCCL, no MUSA variables.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../common.sh"
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
launch_pretrain --backend "${BACKEND:-cuda}" --model llama3 --model-size tiny \
  --tensor-model-parallel-size 2 --sequence-parallel \
  --micro-batch-size 2 --global-batch-size 8 --train-iters 30 --lr 1e-3 --lr-warmup-iters 2 \
  --mock-data --log-interval 5 --log-dir "${LOG_DIR:-runs/llama3}" "$@"
