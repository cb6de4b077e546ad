#!/usr/bin/env bash
# Mixtral (MoE) pretraining on Moore Threads GPUs (MUSA). Defaults: a tiny Mixtral (4 experts, top-2) with
# expert parallelism 2 on 2 processes, on mock data; with --backend cpu it finishes on a 2-core box.
# Real data: --data-path PREFIX --tokenizer-model DIR, or DATA_PATH=PREFIX TOKENIZER_MODEL=DIR.
# Real shape: --model-size 8x7b with e.g. --expert-model-parallel-size 8 --tensor-model-parallel-size 2
# --sequence-parallel --use-distributed-optimizer --bf16 on NPROC_PER_NODE=8 and several nodes.
# Writes runs/dist_run_pretrain_megatron_mixtral_musa/ (LOG_DIR= or --log-dir to change).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../common.sh"
prepare_launch musa "$@"
export_musa_defaults
from_hf_args mixtral  # HF_DIR=/path/to/hf/checkpoint: train from it (see ../common.sh)
launch_pretrain --backend "${BACKEND:-musa}" --model mixtral --model-size tiny \
  --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall \
  --micro-batch-size 2 --global-batch-size 8 --train-iters 30 --lr 1e-3 --lr-warmup-iters 2 \
  "${DATA_ARGS[@]}" --log-interval 5 --log-dir "$RUN_DIR" "${HF_ARGS[@]}" "$@"
