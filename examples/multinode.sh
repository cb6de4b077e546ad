# Several nodes from one command, sourced by common.sh (docs/launchers.md). Three ways, one torchrun per node:
#   HOSTFILE=path   this launcher starts every host's node through REMOTE_SHELL (default `ssh -o BatchMode=yes`,
#                   called as `$REMOTE_SHELL host command`): same working directory, same script and arguments,
#                   the exported run environment (forward_names), a c10d rendezvous on the first host, each
#                   node's output in <run dir>/node<k>.log; a failed node or Ctrl-C stops every node.
#   Slurm           SLURM_JOB_ID set: NNODES, NODE_RANK, MASTER_ADDR from SLURM_NNODES, SLURM_NODEID and the first
#                   host of SLURM_JOB_NODELIST (examples/slurm/sbatch_pretrain.sh runs a launcher with srun).
#   by hand         NNODES, NODE_RANK, MASTER_ADDR (MASTER_PORT) exported on each node, as before.
# Mistakes found before anything starts (a host that cannot be reached, a world size the layout does not divide,
# more processes than a node has devices, HF_DIR missing on a node) are one line on stderr and exit status 2.
# May assume: bash >= 4.2, GNU coreutils/grep and /proc on the nodes (Linux), the same paths on every node
# (the repository and the run directory on a shared file system, as MT-MegatronLM's launchers assume).

# expand_nodelist LIST: one host per line from a Slurm node list: plain names and the bracket forms
# node[01-03,07],gpu5 (zero padding kept; several bracket groups in one name expand left to right).
expand_nodelist() {
  local list=$1 items=() cur="" depth=0 c i item prefix body suffix range lo hi n w
  for ((i = 0; i < ${#list}; i++)); do
    c=${list:i:1}
    case $c in "[") depth=1 ;; "]") depth=0 ;; esac
    if [[ $c == , && $depth == 0 ]]; then items+=("$cur"); cur=""; else cur+=$c; fi
  done
  items+=("$cur")
  for item in "${items[@]}"; do
    [[ -z $item ]] && continue
    if [[ $item =~ ^([^][]*)\[([^][]*)\](.*)$ ]]; then
      prefix=${BASH_REMATCH[1]} body=${BASH_REMATCH[2]} suffix=${BASH_REMATCH[3]}
      local ranges=()
      IFS=, read -r -a ranges <<< "$body"
      for range in "${ranges[@]}"; do
        lo=${range%%-*} hi=${range#*-} w=${#lo}
        [[ $lo =~ ^[0-9]+$ && $hi =~ ^[0-9]+$ ]] || { echo "bad node range '$range' in '$1'" >&2; return 2; }
        for ((n = 10#$lo; n <= 10#$hi; n++)); do
          if [[ $suffix == *"["* ]]; then
            expand_nodelist "$(printf '%s%0*d%s' "$prefix" "$w" "$n" "$suffix")" || return
          else
            printf '%s%0*d%s\n' "$prefix" "$w" "$n" "$suffix"
          fi
        done
      done
    else
      echo "$item"
    fi
  done
  return 0
}

# slurm_hosts: the hosts of this Slurm job, one a line (scontrol show hostnames where present).
slurm_hosts() {
  if command -v scontrol > /dev/null 2>&1; then scontrol show hostnames "$SLURM_JOB_NODELIST"
  else expand_nodelist "$SLURM_JOB_NODELIST"; fi
}

# slurm_defaults: under Slurm (SLURM_JOB_ID set), NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT from the job unless
# exported (an exported value wins); the port follows the job id so two jobs sharing a node do not collide.
slurm_defaults() {
  [[ -n ${SLURM_JOB_ID:-} && -z ${HOSTFILE:-} && -z ${RDZV_ID:-} ]] || return 0
  local first
  first=$(slurm_hosts | head -n 1) || return
  NNODES=${NNODES:-${SLURM_NNODES:-1}}
  NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-0}}
  MASTER_ADDR=${MASTER_ADDR:-$first}
  MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
}

# The environment a node gets from the launching shell (captured when common.sh is sourced, before the launcher
# sets its own defaults, which every node then sets for itself): these prefixes and names, plus FORWARD_ENV="A B".
FORWARD_PREFIXES="MUSA_ MCCL_ CUDA_ NCCL_ NVTE_ TORCH_ TORCHINDUCTOR_ PYTORCH_ PYTHON OMP_ MKL_ GLOO_ UCX_ \
MTMEGATRON_ HF_ TRANSFORMERS_ TOKENIZERS_ TRITON_ WANDB_"
FORWARD_NAMES="PATH LD_LIBRARY_PATH LD_PRELOAD VIRTUAL_ENV CONDA_PREFIX CONDA_DEFAULT_ENV DATA_PATH TOKENIZER_MODEL \
IMAGE_FOLDER STAGE MODEL BACKEND LOG_DIR MCORE_DIR CONVERT_WORKERS CONVERT_WAIT_S NPROC_PER_NODE MASTER_PORT"

forward_env() {  # prints NAME=VALUE words (single-quoted) of the exported variables a node gets
  local name p keep
  for name in $(compgen -e); do
    keep=""
    for p in $FORWARD_PREFIXES; do [[ $name == "$p"* ]] && keep=1; done
    for p in $FORWARD_NAMES ${FORWARD_ENV:-}; do [[ $name == "$p" ]] && keep=1; done
    [[ -n $keep ]] && printf '%s=%s ' "$name" "$(squote "${!name}")"
  done
  return 0
}

squote() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }  # one word for any POSIX shell

# run_pids ID: the processes of this machine started for one node of a run (MTMEGATRON_RUN_ID=ID in their
# environment, <rendezvous id>-node<k>: the node's launcher, its torchrun agent and the ranks, which torchrun
# puts in sessions of their own; two nodes of one run on one machine have different ids).
run_pids() {
  local f pid
  for f in $(grep -lzx "MTMEGATRON_RUN_ID=$1" /proc/[0-9]*/environ 2> /dev/null); do
    pid=${f#/proc/}; pid=${pid%/environ}
    [[ $pid != "$$" && $pid != "$BASHPID" ]] && echo "$pid"
  done
  return 0
}

# stop_run ID [GRACE_S]: SIGTERM to every process of run ID on this machine, SIGKILL to what is left after
# GRACE_S seconds (default 5). Sent to every host when a run stops; each node also runs it when its agent ends.
stop_run() {
  local id=$1 grace=${2:-5} pids i
  for ((i = 0; i <= grace * 4; i++)); do
    pids=$(run_pids "$id")
    [[ -z $pids ]] && return 0
    if ((i == 0)); then kill -TERM $pids 2> /dev/null || true
    elif ((i == grace * 4)); then kill -KILL $pids 2> /dev/null || true; fi
    sleep 0.25
  done
  return 0
}

multinode_error() { echo "$(basename "$0"): $*" >&2; exit 2; }

# layout_error WORLD ARGS...: why WORLD ranks cannot hold the parallel layout ARGS name (empty when they can).
layout_error() {
  local world=$1
  shift
  local tp pp cp ep
  tp=$(flag_value tensor-model-parallel-size 1 "$@"); pp=$(flag_value pipeline-model-parallel-size 1 "$@")
  cp=$(flag_value context-parallel-size 1 "$@"); ep=$(flag_value expert-model-parallel-size 1 "$@")
  if ((world % (tp * pp * cp))); then echo "world size $world is not divisible by TP $tp x PP $pp x CP $cp"
  elif ((world % (ep * tp * pp))); then echo "world size $world is not divisible by EP $ep x expert-TP $tp x PP $pp"
  fi
}

# node_facts BACKEND: what a node reports before a run: devices=N (device backends, when torch can count them)
# and hf=1|0 (HF_DIR set: whether this node sees it or its converted checkpoint).
node_facts() {
  if [[ $1 != cpu ]]; then
    echo "devices=$(python -c 'import sys
from mtmegatron.backends.registry import get_backend
b = get_backend(sys.argv[1])
print(b.device_module().device_count() if b.is_available() else "")' "$1" 2> /dev/null)"
  fi
  if [[ -n ${HF_DIR:-} ]]; then
    local hf=${HF_DIR%/} out
    out=${MCORE_DIR:-$hf-mcore}
    if [[ -d $hf || -f ${out%/}/conversion_complete.json ]]; then echo hf=1; else echo hf=0; fi
  fi
  return 0
}

# check_node_facts HOST NPROC FACTS: the one-line error for a node whose facts do not fit the run.
check_node_facts() {
  local host=$1 nproc=$2 facts=$3 devices
  devices=$(sed -n 's/^devices=//p' <<< "$facts")
  if [[ -n $devices ]] && ((nproc > devices)); then
    multinode_error "$host: $nproc processes per node but it has $devices $BACKEND_USED devices (NPROC_PER_NODE or slots=)"
  fi
  if grep -qx hf=0 <<< "$facts"; then multinode_error "$host: HF_DIR $HF_DIR is not there (nor its converted checkpoint)"; fi
}

# read_hostfile FILE: HOSTS and SLOTS (processes per host: slots=N, else NPROC_PER_NODE) from an MT-MegatronLM /
# DeepSpeed hostfile: one host a line, # comments, blank lines ignored.
read_hostfile() {
  HOSTS=() SLOTS=()
  [[ -r $1 ]] || multinode_error "HOSTFILE $1 cannot be read"
  local line words word slots
  while IFS= read -r line || [[ -n $line ]]; do
    read -r -a words <<< "${line%%#*}"
    ((${#words[@]})) || continue
    slots=$NPROC_PER_NODE
    for word in "${words[@]:1}"; do
      case $word in
        slots=*) slots=${word#slots=} ;;
        *) multinode_error "HOSTFILE $1: '$word' after host ${words[0]} (expected slots=N)" ;;
      esac
    done
    [[ $slots =~ ^[1-9][0-9]*$ ]] || multinode_error "HOSTFILE $1: slots=$slots for ${words[0]} (a positive count)"
    HOSTS+=("${words[0]}"); SLOTS+=("$slots")
  done < "$1"
  ((${#HOSTS[@]})) || multinode_error "HOSTFILE $1 names no host"
}

# launch_hostfile ARGS...: the launcher run on every host of HOSTFILE (ARGS: the full pretrain arguments, for the
# layout check; each node reruns the launcher with the user's own arguments, LAUNCH_ARGS). Exits with the first
# failed node's status, 0 when every node finished, 130/143 on Ctrl-C/SIGTERM.
launch_hostfile() {
  local remote=${REMOTE_SHELL:-ssh -o BatchMode=yes} script cwd world=0 k n why id port env_words log_dir
  read_hostfile "$HOSTFILE"
  n=${#HOSTS[@]}
  for k in "${!HOSTS[@]}"; do world=$((world + SLOTS[k])); done
  why=$(layout_error "$world" "$@")
  [[ -z $why ]] || multinode_error "HOSTFILE $HOSTFILE: $why ($n hosts, ${SLOTS[*]} processes)"
  script=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
  cwd=$(pwd)
  env_words=${FORWARD_WORDS-$(forward_env)}
  # every host answers before any starts: reachable, devices, HF_DIR
  local probe facts=() pids=() rc
  probe="cd $(squote "$cwd") && env $env_words bash -c $(squote "$(declare -f node_facts); node_facts \"\$1\"") \
node_facts $(squote "$BACKEND_USED")"
  for k in "${!HOSTS[@]}"; do
    facts[k]=$(mktemp)
    timeout "${REACH_TIMEOUT_S:-30}" $remote "${HOSTS[k]}" "$probe" > "${facts[k]}" 2> /dev/null < /dev/null &
    pids[k]=$!
  done
  for k in "${!HOSTS[@]}"; do
    rc=0; wait "${pids[k]}" || rc=$?
    if ((rc)); then
      rm -f "${facts[@]}"
      multinode_error "HOSTFILE $HOSTFILE: cannot reach ${HOSTS[k]} with '$remote' (exit status $rc)"
    fi
  done
  for k in "${!HOSTS[@]}"; do check_node_facts "${HOSTS[k]}" "${SLOTS[k]}" "$(cat "${facts[k]}")"; done
  rm -f "${facts[@]}"

  log_dir=$(flag_value log-dir "$RUN_DIR" "$@")
  mkdir -p "$log_dir"
  port=${MASTER_PORT:-29500}
  id=${RDZV_ID:-mtm-$(basename "$0" .sh)-$(hostname)-$$-$RANDOM}
  RUN_ID=$id
  local cmd args="" a node_pids=() done_=() failed=""
  for a in ${LAUNCH_ARGS[@]+"${LAUNCH_ARGS[@]}"}; do args+=" $(squote "$a")"; done
  NODE_PIDS=()
  trap 'stop_nodes "$remote"; exit 130' INT
  trap 'stop_nodes "$remote"; exit 143' TERM HUP
  for k in "${!HOSTS[@]}"; do
    cmd="cd $(squote "$cwd") && exec env -u HOSTFILE $env_words NNODES=$n NODE_RANK=$k NPROC_PER_NODE=${SLOTS[k]} \
MASTER_ADDR=$(squote "${HOSTS[0]}") MASTER_PORT=$port RDZV_ENDPOINT=$(squote "${HOSTS[0]}:$port") \
RDZV_ID=$(squote "$id") MTMEGATRON_RUN_ID=$(squote "$id-node$k") bash $(squote "$script")$args"
    if command -v setsid > /dev/null; then
      setsid $remote "${HOSTS[k]}" "$cmd" > "$log_dir/node$k.log" 2>&1 < /dev/null &
    else
      $remote "${HOSTS[k]}" "$cmd" > "$log_dir/node$k.log" 2>&1 < /dev/null &
    fi
    node_pids[k]=$!
    NODE_PIDS[k]=$!
    echo "node $k of $n (${HOSTS[k]}, ${SLOTS[k]} processes): log in $log_dir/node$k.log"
  done
  while :; do
    local running=0
    for k in "${!HOSTS[@]}"; do
      [[ -n ${done_[k]:-} ]] && continue
      if kill -0 "${node_pids[k]}" 2> /dev/null; then running=$((running + 1)); continue; fi
      rc=0; wait "${node_pids[k]}" || rc=$?
      done_[k]=1
      if ((rc)); then failed=$k; break 2; fi
    done
    ((running)) || break
    sleep 0.5
  done
  if [[ -n $failed ]]; then
    echo "$(basename "$0"): node $failed (${HOSTS[failed]}) stopped with exit status $rc: stopping every node" \
      "(its log: $log_dir/node$failed.log)" >&2
    stop_nodes "$remote"
    exit "$rc"
  fi
  trap - INT TERM HUP
  echo "all $n nodes finished (logs in $log_dir/node*.log)"
  exit 0
}

# stop_nodes REMOTE: every process of the run stopped on every host (stop_run of its node, through REMOTE), then the local
# remote-shell sessions.
stop_nodes() {
  trap '' INT TERM HUP
  local remote=$1 k stops=() p
  for k in "${!HOSTS[@]}"; do
    timeout "${REACH_TIMEOUT_S:-30}" $remote "${HOSTS[k]}" \
      "bash -c $(squote "$(declare -f run_pids stop_run); stop_run $(squote "$RUN_ID-node$k")")" \
      < /dev/null > /dev/null 2>&1 &
    stops+=($!)
  done
  for p in ${stops[@]+"${stops[@]}"}; do wait "$p" 2> /dev/null || true; done
  for p in ${NODE_PIDS[@]+"${NODE_PIDS[@]}"}; do kill -TERM -- "-$p" 2> /dev/null || kill -TERM "$p" 2> /dev/null || true; done
  for p in ${NODE_PIDS[@]+"${NODE_PIDS[@]}"}; do wait "$p" 2> /dev/null || true; done
  return 0
}

# node_checks: on a node of a Slurm or by-hand run of several nodes, its devices and HF_DIR (prepare_launch, before
# a conversion starts). layout_checks ARGS...: world size NNODES x NPROC_PER_NODE against the layout ARGS name.
node_checks() {
  [[ -z ${HOSTFILE:-} && -z ${RDZV_ID:-} ]] && ((NNODES > 1)) || return 0  # a HOSTFILE's hosts: checked by its probe
  check_node_facts "$(hostname)" "$NPROC_PER_NODE" "$(node_facts "$BACKEND_USED")"
}

layout_checks() {
  [[ -z ${RDZV_ID:-} ]] && ((NNODES > 1)) || return 0
  local why
  why=$(layout_error $((NNODES * NPROC_PER_NODE)) "$@")
  [[ -z $why ]] || multinode_error "$why ($NNODES nodes x NPROC_PER_NODE $NPROC_PER_NODE)"
}

# run_node ARGS...: this node's torchrun in a c10d rendezvous (RDZV_ENDPOINT, RDZV_ID; the first node hosts it);
# when the agent ends, whatever it left of the run on this machine is stopped, and its status is this node's.
run_node() {
  local agent rc=0 host=0
  [[ $NODE_RANK == 0 ]] && host=1
  export MTMEGATRON_RUN_ID=${MTMEGATRON_RUN_ID:-$RDZV_ID}
  torchrun --nproc_per_node "$NPROC_PER_NODE" --nnodes "$NNODES" --rdzv_backend c10d \
    --rdzv_endpoint "$RDZV_ENDPOINT" --rdzv_id "$RDZV_ID" --rdzv_conf "is_host=$host" \
    -m mtmegatron.pretrain "$@" &
  agent=$!
  trap 'kill -TERM "$agent" 2> /dev/null || true' INT TERM HUP
  while :; do
    rc=0; wait "$agent" || rc=$?
    kill -0 "$agent" 2> /dev/null || break  # a trapped signal interrupted the wait: wait for the agent again
  done
  trap '' INT TERM HUP
  stop_run "$MTMEGATRON_RUN_ID"
  exit "$rc"
}
