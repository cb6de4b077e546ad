# Shared by the dist_run_pretrain_*.sh launchers: torchrun arguments from the usual cluster variables.
# Single box by default; for several nodes export NNODES, NODE_RANK, MASTER_ADDR (and MASTER_PORT) on each.
# Every argument given to a launcher is passed to mtmegatron.pretrain, after the example's defaults,
# so any Megatron-LM flag (or --backend cpu|cuda|musa) overrides them.

NPROC_PER_NODE=${NPROC_PER_NODE:-2}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}

launch_pretrain() {
  exec torchrun --nproc_per_node "$NPROC_PER_NODE" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" -m mtmegatron.pretrain "$@"
}

# MUSA launch defaults (mtmegatron.backends.musa.launch_env): only settings right on any MUSA machine
# (CUDA_DEVICE_MAX_CONNECTIONS=1, MUSA_KERNEL_TIMEOUT, OMP_NUM_THREADS). Moore Threads' cluster tuning
# (MCCL_IB_GID_INDEX=3, MCCL_ALGOS, MCCL_PROTOS, MCCL_BUFFSIZE, MCCL_CHECK_POINTERS, MUSA_BLOCK_SCHEDULE_MODE) is
# opt-in: export MTMEGATRON_MCCL_CLUSTER_PROFILE=mt-deepseek. An exported value always wins.
export_musa_defaults() {
  local lines
  lines=$(python -c 'from mtmegatron.backends.musa import launch_env
try:
    env = launch_env()
except ValueError as e:
    raise SystemExit(f"export_musa_defaults: {e}")
print("\n".join(f"export {k}=${{{k}:-{v}}}" for k, v in env.items()))') || return 1
  eval "$lines"
}

# HF_DIR set: convert that HF checkpoint once (into MCORE_DIR, default "$HF_DIR-mcore") and put the converted
# model's flags and --load into the array HF_ARGS (empty otherwise). Usage: from_hf_args llama3|mixtral|deepseek-v3
from_hf_args() {
  HF_ARGS=()
  [[ -z "${HF_DIR:-}" ]] && return 0
  local out=${MCORE_DIR:-$HF_DIR-mcore}
  if [[ ! -f "$out/latest_checkpointed_iteration.txt" ]]; then
    python -m mtmegatron.cli convert hf-to-mcore --model "$1" --hf-dir "$HF_DIR" --out "$out"
  fi
  eval "HF_ARGS=($(cat "$out/model_flags.txt") --load \"\$out\")"
}
