#!/usr/bin/env bash
# Gemma 3 (text) pretraining on Moore Threads GPUs (MUSA). Defaults: the tiny Gemma 3 (6 layers: 5 sliding-window
# : 1 global, window 8, two RoPE bases, (1 + w) norms, tied embeddings), TP2 with sequence parallelism, 30
# iterations, on mock data -- it also finishes on a 2-core CPU box in about a minute with --backend cpu.
# Real data: --data-path PREFIX --tokenizer-model DIR (from `mtmegatron preprocess`), or DATA_PATH=PREFIX
# TOKENIZER_MODEL=DIR. Real shapes: --model-size 1b (or 4b, 12b, 27b) plus your parallel layout, e.g.
#   NPROC_PER_NODE=8 bash dist_run_pretrain_megatron_gemma3_musa.sh --model-size 4b \
#     --tensor-model-parallel-size 2 --use-distributed-optimizer --global-batch-size 256 --bf16
# From a Hugging Face checkpoint: HF_DIR=/path/to/gemma-3-1b-pt (converted once, see ../common.sh).
# Writes runs/dist_run_pretrain_megatron_gemma3_musa/ (LOG_DIR= or --log-dir to change).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../common.sh"
prepare_launch musa "$@"
export_musa_defaults
from_hf_args gemma3  # HF_DIR=/path/to/hf/checkpoint: train from it (see ../common.sh)
launch_pretrain --backend "${BACKEND:-musa}" --model gemma3 --model-size tiny \
  --tensor-model-parallel-size 2 --sequence-parallel \
  --micro-batch-size 2 --global-batch-size 8 --train-iters 30 --lr 1e-3 --lr-warmup-iters 2 \
  "${DATA_ARGS[@]}" --log-interval 5 --log-dir "$RUN_DIR" "${HF_ARGS[@]}" "$@"
