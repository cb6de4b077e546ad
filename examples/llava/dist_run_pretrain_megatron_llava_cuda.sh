#!/usr/bin/env bash
# The CUDA twin of dist_run_pretrain_megatron_llava_musa.sh: same defaults, data, HF_DIR and STAGE handling,
# NCCL, no MUSA variables. Defaults: the tiny LLaVA, TP2 with sequence parallelism, 30 iterations, on the
# embedded shapes dataset (generated images with questions about them; no network) -- it also finishes on a
# 2-core CPU box with --backend cpu. Writes metrics.jsonl (with image_tokens), image_eval.json (held-out loss
# with and without the images) and samples.txt (answers about held-out images) to
# runs/dist_run_pretrain_megatron_llava_cuda/ (LOG_DIR= or --log-dir to change).
# Real data: --data-path data.jsonl [--image-folder DIR] (LLaVA/ShareGPT conversations; see docs/llava.md), or
# DATA_PATH=data.jsonl [IMAGE_FOLDER=DIR]; --tokenizer-model DIR for a real tokenizer.
# From HF weights: HF_DIR=/path/to/llava-hf-checkpoint converts it once (mtmegatron convert hf-to-mcore
# --model llava) and trains from it with its shape flags; then, as in LLaVA's recipe:
#   STAGE=1  projector only (--freeze-LM --freeze-ViT) on captions (--prompt-format plain)
#   STAGE=2  LLaVA's stage 2: language model + projector (--freeze-ViT), conversations
# (no STAGE: every weight trains, what the tiny from-scratch default needs). Real shapes, e.g.
#   HF_DIR=llava-1.5-7b-hf STAGE=2 NPROC_PER_NODE=8 bash dist_run_pretrain_megatron_llava_cuda.sh \
#     --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 14 \
#     --global-batch-size 128 --bf16
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../common.sh"
source "$here/llava_launch.sh"
prepare_launch cuda "$@"
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
llava_args "$@"
launch_pretrain --backend "${BACKEND:-cuda}" --model llava --model-size tiny \
  --tensor-model-parallel-size 2 --sequence-parallel \
  --micro-batch-size 2 --global-batch-size 8 --train-iters 30 --lr 2e-3 --lr-warmup-iters 2 \
  "${LLAVA_DATA_ARGS[@]}" "${STAGE_ARGS[@]}" --log-interval 5 --log-dir "$RUN_DIR" "${HF_ARGS[@]}" "$@"
