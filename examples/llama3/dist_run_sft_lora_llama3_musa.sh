#!/usr/bin/env bash
# Llama-3 supervised fine-tuning with LoRA adapters on Moore Threads GPUs (MUSA). Defaults: the tiny Llama-3,
# rank-8 adapters (alpha 16) on linear_qkv/linear_proj/linear_fc1/linear_fc2 over a frozen base, TP2 with sequence
# parallelism, 30 iterations, on the embedded arithmetic conversations -- it also finishes on a 2-core CPU box with
# --backend cpu (without HF_DIR the base is the tiny model's random initialisation: a smoke run).
# A real base: HF_DIR=/path/to/hf/checkpoint (converted once into MCORE_DIR, default <HF_DIR>-mcore, and loaded
# with --load as the frozen base). Real conversations (messages / ShareGPT / Alpaca JSONL, docs/sft.md):
# DATA_PATH="chats.jsonl [more.jsonl]" with TOKENIZER_MODEL=DIR (default: HF_DIR), rendered with the tokenizer's
# chat template, or --data-path ... --tokenizer-model DIR on the command line. Every argument overrides a default.
#   HF_DIR=Meta-Llama-3-8B-Instruct DATA_PATH=chats.jsonl NPROC_PER_NODE=8 \
#     bash dist_run_sft_lora_llama3_musa.sh --tensor-model-parallel-size 2 --bf16 --global-batch-size 64
# Writes runs/dist_run_sft_lora_llama3_musa/ (LOG_DIR= or --log-dir to change), the adapters in its adapters/
# (docs/lora.md: merge them or export an HF PEFT adapter with `mtmegatron convert mcore-to-hf --lora-load`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../common.sh"
prepare_launch musa "$@"
export_musa_defaults
from_hf_args llama3  # HF_DIR=/path/to/hf/checkpoint: the frozen base (see ../common.sh)
# SFT reads conversations, not pretraining data: no data given means the embedded task (its own tokenizer, the
# plain template), never --mock-data; given data is rendered with its tokenizer's chat template
SFT_ARGS=(--sft-tokenizer-prompt-format plain)
if [[ ${DATA_ARGS[0]:-} == --mock-data ]]; then DATA_ARGS=(); fi
if ((${#DATA_ARGS[@]})) || has_flag data-path "$@"; then SFT_ARGS=(--sft-tokenizer-prompt-format tokenizer); fi
if ((${#DATA_ARGS[@]})) && [[ -z ${TOKENIZER_MODEL:-} && -n ${HF_DIR:-} ]]; then DATA_ARGS+=(--tokenizer-model "$HF_DIR"); fi
launch_pretrain --backend "${BACKEND:-musa}" --model llama3 --model-size tiny --transformer-impl local \
  --tensor-model-parallel-size 2 --sequence-parallel \
  --micro-batch-size 2 --global-batch-size 8 --train-iters 30 --lr 1e-3 --lr-warmup-iters 2 \
  --sft "${SFT_ARGS[@]}" "${DATA_ARGS[@]}" --lora-r 8 --lora-alpha 16 \
  --log-interval 5 --log-dir "$RUN_DIR" --save "$RUN_DIR/adapters" "${HF_ARGS[@]}" "$@"
