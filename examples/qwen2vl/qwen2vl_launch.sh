# Shared by the two Qwen2-VL / Qwen2.5-VL launchers (sourced after ../common.sh). qwen2vl_args ARGS... sets
#   MODEL_ARGS:  --model $MODEL (qwen2.5-vl unless MODEL=qwen2-vl is exported).
#   QWEN_DATA_ARGS: empty when ARGS give --data-path or --train-data-path; --data-path $DATA_PATH
#                [--image-folder $IMAGE_FOLDER] when DATA_PATH is exported; else the embedded fine-detail task
#                (mtmegatron/data/vision/textures.py: generated once, cached; its train and held-out files).
#                Never --mock-data: it would train the language model alone.
#   HF_ARGS:     HF_DIR set -> the converted checkpoint's flags and --load (from_hf_args $MODEL).
qwen2vl_args() {
  local model=${MODEL:-qwen2.5-vl}
  case "$model" in
    qwen2-vl|qwen2.5-vl) ;;
    *) echo "MODEL=$model: use qwen2-vl or qwen2.5-vl" >&2; return 2 ;;
  esac
  MODEL_ARGS=(--model "$model")
  QWEN_DATA_ARGS=()
  if has_flag data-path "$@" || has_flag train-data-path "$@"; then
    :
  elif [[ -n "${DATA_PATH:-}" ]]; then
    QWEN_DATA_ARGS=(--data-path "$DATA_PATH")
    if [[ -n "${IMAGE_FOLDER:-}" ]]; then QWEN_DATA_ARGS+=(--image-folder "$IMAGE_FOLDER"); fi
  else
    local task
    task=$(python -c 'from mtmegatron.data.vision import textures; print(textures.prepare())') || return 1
    QWEN_DATA_ARGS=(--train-data-path "$task/train.jsonl" --valid-data-path "$task/valid.jsonl")
  fi
  from_hf_args "$model"
}
