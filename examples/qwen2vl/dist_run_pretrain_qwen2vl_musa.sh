#!/usr/bin/env bash
# Qwen2.5-VL (or MODEL=qwen2-vl): native-resolution vision encoder + M-RoPE language model on Moore Threads GPUs
# (MUSA). Defaults: the tiny model, PP2 with the vision encoder and one language layer on stage 0
# (--decoder-first-pipeline-num-layers 1; the start-up line names the FLOP-balanced split for your shapes),
# 40 iterations, on the embedded fine-detail task (pictures of 112-196 px whose answer needs their full resolution;
# generated, no network) -- it also finishes on a 2-core CPU box with --backend cpu. Writes metrics.jsonl and
# answer_eval.json (held-out answer accuracy) to runs/dist_run_pretrain_qwen2vl_musa/ (LOG_DIR= or --log-dir).
# Real data: --data-path conversations.jsonl [--image-folder DIR] (LLaVA/ShareGPT-style records with any number
# of "image"/"video" entries; see docs/qwen_vl.md), or DATA_PATH=... [IMAGE_FOLDER=DIR]; --tokenizer-model DIR
# (the HF checkpoint's tokenizer) for a real tokenizer. --balance-micro-batches evens the vision load over ranks.
# From HF weights: HF_DIR=/path/to/Qwen2.5-VL-7B-Instruct converts it once (mtmegatron convert hf-to-mcore
# --model qwen2.5-vl) and trains from it with its shape flags, e.g.
#   HF_DIR=Qwen2.5-VL-7B-Instruct NPROC_PER_NODE=8 bash dist_run_pretrain_qwen2vl_musa.sh \
#     --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 4 \
#     --decoder-first-pipeline-num-layers 1 --tokenizer-model Qwen2.5-VL-7B-Instruct --data-path data.jsonl \
#     --seq-length 4096 --max-position-embeddings 4096 --global-batch-size 128 --bf16 --freeze-ViT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../common.sh"
source "$here/qwen2vl_launch.sh"
prepare_launch musa "$@"
export_musa_defaults
qwen2vl_args "$@"
launch_pretrain --backend "${BACKEND:-musa}" "${MODEL_ARGS[@]}" --model-size tiny \
  --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1 \
  --micro-batch-size 4 --global-batch-size 8 --train-iters 40 --lr 1e-3 --lr-warmup-iters 4 \
  --lr-decay-style constant --eval-iters 1 --eval-interval 1000 \
  "${QWEN_DATA_ARGS[@]}" --log-interval 5 --log-dir "$RUN_DIR" "${HF_ARGS[@]}" "$@"
