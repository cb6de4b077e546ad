#!/usr/bin/env bash
# The CUDA twin of dist_run_pretrain_megatron_gpt_oss_musa.sh: same defaults, data and HF_DIR handling, NCCL,
# no MUSA variables. Writes runs/dist_run_pretrain_megatron_gpt_oss_cuda/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../common.sh"
prepare_launch cuda "$@"
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
from_hf_args gpt-oss  # HF_DIR=/path/to/hf/checkpoint: train from it (see ../common.sh)
launch_pretrain --backend "${BACKEND:-cuda}" --model gpt-oss --model-size tiny \
  --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall \
  --micro-batch-size 2 --global-batch-size 8 --train-iters 30 --lr 1e-3 --lr-warmup-iters 2 \
  "${DATA_ARGS[@]}" --log-interval 5 --log-dir "$RUN_DIR" "${HF_ARGS[@]}" "$@"
