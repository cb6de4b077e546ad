#!/usr/bin/env bash
# DeepSeek-V3 pretraining on Moore Threads GPUs (MUSA). Defaults: the tiny DeepSeek-V3 (MLA with q LoRA + YaRN,
# 1 dense + 3 MoE layers, 8 experts top-4 in 4 groups with the biased sigmoid router, a shared expert, one MTP
# layer) on mock data with expert parallelism 2 on 2 processes; with --backend cpu it finishes on a 2-core box.
# Real data: --data-path PREFIX --tokenizer-model DIR (with a --vocab-size the tokenizer fits), or
# DATA_PATH=PREFIX TOKENIZER_MODEL=DIR. Writes runs/dist_run_pretrain_megatron_deepseekv3_musa/ (LOG_DIR=).
# Shapes: --model-size lite (16 layers, hidden 2048, 64 experts: our reduced shape, not a published model),
# --model-size 671b (the published shape: 61 layers, 256 experts, first 3 dense) with e.g.
# --pipeline-model-parallel-size 16 --expert-model-parallel-size 64 --tensor-model-parallel-size 1
# --use-distributed-optimizer --bf16 on many nodes (NNODES/NODE_RANK/MASTER_ADDR, see ../common.sh).
# From an HF checkpoint: HF_DIR=/path/to/DeepSeek-V3 (FP8 weights are dequantized) converts it once into
# MCORE_DIR (default $HF_DIR-mcore) and trains from it; the converted model's flags replace the preset's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../common.sh"
prepare_launch musa "$@"
export_musa_defaults
from_hf_args deepseek-v3
launch_pretrain --backend "${BACKEND:-musa}" --model deepseek-v3 --model-size tiny \
  --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall \
  --micro-batch-size 2 --global-batch-size 8 --train-iters 30 --lr 1e-3 --lr-warmup-iters 2 \
  "${DATA_ARGS[@]}" --log-interval 5 --log-dir "$RUN_DIR" "${HF_ARGS[@]}" "$@"
