#!/usr/bin/env bash
# The CUDA twin of dist_run_sft_lora_llama3_musa.sh: same defaults, data, HF_DIR and adapter handling, NCCL,
# no MUSA variables. Writes runs/dist_run_sft_lora_llama3_cuda/ (the adapters in its adapters/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../common.sh"
prepare_launch cuda "$@"
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
from_hf_args llama3  # HF_DIR=/path/to/hf/checkpoint: the frozen base (see ../common.sh)
# SFT reads conversations, not pretraining data: no data given means the embedded task (its own tokenizer, the
# plain template), never --mock-data; given data is rendered with its tokenizer's chat template
SFT_ARGS=(--sft-tokenizer-prompt-format plain)
if [[ ${DATA_ARGS[0]:-} == --mock-data ]]; then DATA_ARGS=(); fi
if ((${#DATA_ARGS[@]})) || has_flag data-path "$@"; then SFT_ARGS=(--sft-tokenizer-prompt-format tokenizer); fi
if ((${#DATA_ARGS[@]})) && [[ -z ${TOKENIZER_MODEL:-} && -n ${HF_DIR:-} ]]; then DATA_ARGS+=(--tokenizer-model "$HF_DIR"); fi
launch_pretrain --backend "${BACKEND:-cuda}" --model llama3 --model-size tiny --transformer-impl local \
  --tensor-model-parallel-size 2 --sequence-parallel \
  --micro-batch-size 2 --global-batch-size 8 --train-iters 30 --lr 1e-3 --lr-warmup-iters 2 \
  --sft "${SFT_ARGS[@]}" "${DATA_ARGS[@]}" --lora-r 8 --lora-alpha 16 \
  --log-interval 5 --log-dir "$RUN_DIR" --save "$RUN_DIR/adapters" "${HF_ARGS[@]}" "$@"
