#!/usr/bin/env bash
# Runs any dist_run_* launcher on every node of a Slurm job, one launcher per node (srun); each reads its node
# from SLURM_NNODES, SLURM_NODEID and the first host of SLURM_JOB_NODELIST (../multinode.sh), so no hostfile and
# no exported NODE_RANK. Usage, from the repository (the same path on every node):
#   sbatch --nodes 4 examples/slurm/sbatch_pretrain.sh examples/llama3/dist_run_pretrain_megatron_llama3_musa.sh \
#     --model-size 8b --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --bf16
# NPROC_PER_NODE (default: SLURM_GPUS_ON_NODE when Slurm gives GPUs, else the launcher's 2) and the launcher's other
# variables (DATA_PATH, HF_DIR, MUSA_*/MCCL_*, ...) are read from the environment sbatch passes on. MASTER_PORT
# defaults to 20000 + job id % 20000. Slurm's own output: runs/slurm-<job id>.out.
#SBATCH --job-name=mtmegatron
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --output=runs/slurm-%j.out
set -euo pipefail
launcher=${1:?usage: sbatch [--nodes N] examples/slurm/sbatch_pretrain.sh <dist_run_*.sh> [flags...]}
shift
if [[ -z ${NPROC_PER_NODE:-} && -n ${SLURM_GPUS_ON_NODE:-} ]]; then export NPROC_PER_NODE=$SLURM_GPUS_ON_NODE; fi
# one task per node; a node that fails ends the job's other tasks (--kill-on-bad-exit)
exec srun --nodes "$SLURM_NNODES" --ntasks-per-node 1 --kill-on-bad-exit=1 bash "$launcher" "$@"
