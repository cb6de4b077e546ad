# Shared by the two LLaVA launchers (sourced after ../common.sh). llava_args ARGS... sets
#   LLAVA_DATA_ARGS: empty when ARGS give --data-path; --data-path $DATA_PATH [--image-folder $IMAGE_FOLDER]
#                    when DATA_PATH is exported; else empty (the embedded shapes dataset). Never --mock-data:
#                    LLaVA refuses all-zero images.
#   STAGE_ARGS:      STAGE=1 -> --freeze-LM --freeze-ViT --prompt-format plain (projector on captions);
#                    STAGE=2 -> --freeze-ViT (language model + projector); unset -> empty (everything trains).
#   HF_ARGS:         HF_DIR set -> the converted checkpoint's flags and --load (from_hf_args llava).
llava_args() {
  LLAVA_DATA_ARGS=()
  if ! has_flag data-path "$@" && [[ -n "${DATA_PATH:-}" ]]; then
    LLAVA_DATA_ARGS=(--data-path "$DATA_PATH")
    if [[ -n "${IMAGE_FOLDER:-}" ]]; then LLAVA_DATA_ARGS+=(--image-folder "$IMAGE_FOLDER"); fi
  fi
  case "${STAGE:-}" in
    "") STAGE_ARGS=() ;;
    1) STAGE_ARGS=(--freeze-LM --freeze-ViT --prompt-format plain) ;;
    2) STAGE_ARGS=(--freeze-ViT) ;;
    *) echo "STAGE=$STAGE: use 1 (projector only) or 2 (language model + projector), or leave it unset" >&2
       return 2 ;;
  esac
  from_hf_args llava
}
