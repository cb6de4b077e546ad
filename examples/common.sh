# Shared by the dist_run_pretrain_*.sh launchers: torchrun arguments from the usual cluster variables.
# Single box by default; several nodes (multinode.sh, docs/launchers.md): HOSTFILE=path starts every host from
# here, under Slurm the SLURM_* variables say the node, or export NNODES, NODE_RANK, MASTER_ADDR (MASTER_PORT) on each.
# Every argument given to a launcher is passed to mtmegatron.pretrain, after the example's defaults,
# so any Megatron-LM flag (or --backend cpu|cuda|musa) overrides them. Data: mock data unless the arguments
# give --data-path (with --tokenizer-model) or DATA_PATH=prefix [TOKENIZER_MODEL=dir] is exported.
# Each example writes to its own run directory, runs/<script name> (LOG_DIR= or --log-dir changes it).

source "$(dirname "${BASH_SOURCE[0]}")/multinode.sh"
if [[ -n ${HOSTFILE:-} ]]; then FORWARD_WORDS=$(forward_env); fi  # what the user exported, before any default
slurm_defaults
NPROC_PER_NODE=${NPROC_PER_NODE:-2}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}

launch_pretrain() {
  if [[ -n ${HOSTFILE:-} ]]; then launch_hostfile "$@"; fi  # every host's node started from here; exits
  layout_checks "$@"
  if [[ -n ${RDZV_ID:-} ]]; then run_node "$@"; fi  # a node of a HOSTFILE run (c10d rendezvous); exits
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
# model's flags and --load into the array HF_ARGS (empty otherwise). Usage: from_hf_args llama3|mixtral|deepseek-v3|...
# Node 0 converts (CONVERT_WORKERS processes, default 4) into the sibling MCORE_DIR (default <HF_DIR>-mcore);
# other nodes wait for its conversion_complete.json (CONVERT_WAIT_S, default 7200)..
from_hf_args() {
  HF_ARGS=()
  [[ -z "${HF_DIR:-}" ]] && return 0
  [[ -n "${HOSTFILE:-}" ]] && return 0  # the launching shell converts nothing: each node runs this itself
  local hf=${HF_DIR%/}  # a trailing slash must not put the output inside the HF directory
  local out=${MCORE_DIR:-$hf-mcore}
  out=${out%/}
  local marker="$out/conversion_complete.json" waited=0
  if [[ ! -f "$marker" ]]; then
    if [[ "${NODE_RANK:-0}" == 0 ]]; then  # one node converts; the others wait for the finished marker
      python -m mtmegatron.cli convert hf-to-mcore --model "$1" --hf-dir "$hf" --out "$out" \
        --workers "${CONVERT_WORKERS:-4}" || return 1
    else
      echo "node $NODE_RANK: waiting for node 0 to convert $hf into $out" >&2
      until [[ -f "$marker" ]]; do
        sleep 10; waited=$((waited + 10))
        if ((waited >= ${CONVERT_WAIT_S:-7200})); then echo "no $marker after ${waited}s" >&2; return 1; fi
      done
    fi
  fi
  eval "HF_ARGS=($(cat "$out/model_flags.txt") --load \"\$out\")"
}

# flag_value NAME DEFAULT ARGS...: the last value of --NAME (or --NAME=V) in ARGS, DEFAULT when absent.
flag_value() {
  local name=$1 value=$2
  shift 2
  while (($#)); do
    case $1 in
      --$name) value=${2:-}; shift ;;
      --$name=*) value=${1#*=} ;;
    esac
    shift
  done
  printf '%s' "$value"
}

has_flag() {
  local name=$1 a
  shift
  for a in "$@"; do [[ $a == "--$name" || $a == --$name=* ]] && return 0; done
  return 1
}

# data_args ARGS...: the array DATA_ARGS: empty when ARGS choose the data (--data-path or --mock-data),
# --data-path $DATA_PATH [--tokenizer-model $TOKENIZER_MODEL] when DATA_PATH is exported (a prefix, or a blend
# "W1 P1 W2 P2"), else --mock-data.
data_args() {
  DATA_ARGS=()
  if has_flag data-path "$@" || has_flag mock-data "$@"; then return 0; fi
  if [[ -n "${DATA_PATH:-}" ]]; then
    read -r -a DATA_ARGS <<< "$DATA_PATH"
    DATA_ARGS=(--data-path "${DATA_ARGS[@]}")
    if [[ -n "${TOKENIZER_MODEL:-}" ]]; then DATA_ARGS+=(--tokenizer-model "$TOKENIZER_MODEL"); fi
    return 0
  fi
  DATA_ARGS=(--mock-data)
}

# set_threads BACKEND: export OMP_NUM_THREADS (threads per rank) unless it is exported already: the cores of
# this node divided by its ranks; with a device backend (cuda, musa) at most 4 (the host only feeds the device).
set_threads() {
  if [[ -n "${OMP_NUM_THREADS:-}" ]]; then return 0; fi
  local cores per
  cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
  per=$((cores / NPROC_PER_NODE))
  if ((per < 1)); then per=1; fi
  if [[ $1 != cpu ]] && ((per > 4)); then per=4; fi
  export OMP_NUM_THREADS=$per
}

# prepare_launch DEFAULT_BACKEND ARGS...: the backend the run will use (--backend in ARGS, else BACKEND=, else
# DEFAULT_BACKEND) into BACKEND_USED, threads for it, DATA_ARGS, and the run directory RUN_DIR.
prepare_launch() {
  local default=$1
  shift
  LAUNCH_ARGS=("$@")  # what a HOSTFILE run hands every node
  BACKEND_USED=$(flag_value backend "${BACKEND:-$default}" "$@")
  node_checks
  set_threads "$BACKEND_USED"
  data_args "$@"
  RUN_DIR=${LOG_DIR:-runs/$(basename "$0" .sh)}
}
