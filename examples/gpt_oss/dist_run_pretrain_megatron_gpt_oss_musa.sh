#!/usr/bin/env bash
# GPT-OSS pretraining on Moore Threads GPUs (MUSA). Defaults: the tiny GPT-OSS (4 layers alternating sliding
# window 8 / full attention, learnable sinks, YaRN, 4 experts top-2 with biases, the clamped SwiGLU) with expert
# parallelism 2 on 2 processes, on mock data; with --backend cpu it finishes on a 2-core box.
# Real data: --data-path PREFIX --tokenizer-model DIR, or DATA_PATH=PREFIX TOKENIZER_MODEL=DIR.
# Real shapes: --model-size 20b (or 120b) with e.g. --expert-model-parallel-size 8 --use-distributed-optimizer
# --bf16 on NPROC_PER_NODE=8 and several nodes. From the release: HF_DIR=<a bf16 GPT-OSS directory> (the MXFP4
# files are refused: dequantise them first, see docs/families/gpt_oss.md).
# Writes runs/dist_run_pretrain_megatron_gpt_oss_musa/ (LOG_DIR= or --log-dir to change).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../common.sh"
prepare_launch musa "$@"
export_musa_defaults
from_hf_args gpt-oss  # HF_DIR=/path/to/hf/checkpoint: train from it (see ../common.sh)
launch_pretrain --backend "${BACKEND:-musa}" --model gpt-oss --model-size tiny \
  --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall \
  --micro-batch-size 2 --global-batch-size 8 --train-iters 30 --lr 1e-3 --lr-warmup-iters 2 \
  "${DATA_ARGS[@]}" --log-interval 5 --log-dir "$RUN_DIR" "${HF_ARGS[@]}" "$@"
