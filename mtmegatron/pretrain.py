"""``torchrun --nproc_per_node N -m mtmegatron.pretrain [Megatron-LM flags]``: pretrain a GPT-style model.

Flags, backend, data and the ``--save``/``--load`` directories are checked before any process group starts
(``prepare``); a user mistake there, or a checkpoint that cannot be loaded later, exits with status 2 and one
message. The kind of run (plain text, SFT, LLaVA, packed-vision Qwen-VL) is a Task chosen once
(tasks/registry.py); ``run`` asks it for the datasets, the step the loop runs and the end-of-run outputs. See
training/ for the loop's pieces.
May assume: launched by torchrun (or as a single plain process).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
import warnings

from mtmegatron.backends import BackendUnavailableError, select_backend
from mtmegatron.patches import UnsupportedMegatronVersion
from mtmegatron.config import parse as parse_run_config
from mtmegatron.config import megatron_core_checks
from mtmegatron.utils.checkpoint_dirs import CheckpointError
from mtmegatron.utils.deferred_imports import leave_out
from mtmegatron.utils.errors import ConfigError, exit_with_user_error
from mtmegatron.utils.quiet import quiet_known_noise

# user mistakes: one line and exit status 2 (utils/errors.py)
USER_ERRORS = (ConfigError, BackendUnavailableError, UnsupportedMegatronVersion, CheckpointError)


def main(argv=None) -> int:
    quiet_known_noise()
    try:
        cfg, backend, task, data = prepare(argv)
    except USER_ERRORS as e:
        exit_with_user_error(str(e))
    try:
        return run(cfg.args, backend, task, data)
    except CheckpointError as e:
        exit_with_user_error(str(e))


def prepare(argv):
    """Everything before the process groups: flags, backend, megatron-core's activation, the FP8 executor, the
    run's task and its prepared data (tasks/). Every user mistake found here is one of USER_ERRORS, reported once
    by ``main``. Returns the RunConfig resolved with what this stage learned (the FP8 executor, the data's facts,
    the run plan), the backend, the task and its data."""
    cfg = parse_run_config(argv)  # every flag resolved once, frozen (config/run_config.py)
    args = copy.copy(cfg.args)  # this stage's own copy: the backend, the FP8 executor and the data add facts to it
    backend = select_backend(args.backend)
    backend.check_precision_args(args, ConfigError)  # e.g. --bf16 on an S80 (no bf16)
    import mtmegatron

    if backend.device_is_host:  # there are no CUDA connections to tune on the host
        warnings.filterwarnings("ignore", message=r".*CUDA_DEVICE_MAX_CONNECTIONS", category=UserWarning)
    mtmegatron.activate(backend)
    megatron_core_checks.check_configs(args)  # megatron-core's config assertions as one line (with its patches)
    if args.fp8_format:  # the FP8 executor depends on the backend and is probed on this rank's device (set first)
        from mtmegatron.fp8.section import Fp8
        from mtmegatron.fp8.spec import choose_executor

        try:
            args.fp8_executor_in_use, args.fp8_executor_note = choose_executor(
                Fp8.of(args), args.transformer_engine_layers, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        except ValueError as e:
            raise ConfigError(str(e)) from None
    from mtmegatron.tasks.registry import TASKS

    task_class = TASKS[cfg.task]  # the kind of run, decided once by parse_run_config
    # parse-time resolution: the task completes this stage's args from its data (tasks/base.py)
    data = task_class.prepare(args, progress=int(os.environ.get("RANK", "0")) == 0)
    from mtmegatron.config.run_plan import plan_run

    run_plan = plan_run(args)  # what this run will do, printed by run()
    if int(os.environ.get("RANK", "0")) == 0:  # the planner's peak for rank 0 (plan/footprint.py), printed by run()
        from mtmegatron.plan.footprint import footprint_line

        # one more start-up line, not a value of args: args is the checkpoint's common state, equal on every rank
        run_plan = dataclasses.replace(run_plan, lines=(*run_plan.lines, footprint_line(args)))
    args.run_plan = run_plan
    cfg = cfg.resolved(args)
    # the Task, built once from the completed values: the sections it reads, and the derived embedded_corpus
    return cfg, backend, task_class.of(cfg.args, embedded_corpus=cfg.args.embedded_corpus), data


def run(args, backend, task, data=None) -> int:
    import torch
    from megatron.core import parallel_state

    from mtmegatron.training.checkpoint import checkpointing
    from mtmegatron.utils import checkpoint_dirs
    from mtmegatron.data.position import SamplePlan
    from mtmegatron.data.section import Batches
    from mtmegatron.training.loop import RunState, train
    from mtmegatron.utils.metrics import MetricsWriter, print_rank0
    from mtmegatron.training.setup import build, count_parameters, init_distributed

    init_distributed(args, backend)
    rank = torch.distributed.get_rank()
    model, optimizer, scheduler, config = build(args)
    num_params = count_parameters(model)
    print_rank0(rank, f"mtmegatron: backend {backend.name} ({backend.dist_backend}) | world "
                f"{torch.distributed.get_world_size()} = TP {args.tensor_model_parallel_size} x PP "
                f"{args.pipeline_model_parallel_size}"
                f"{' (VPP ' + str(args.virtual_pipeline_model_parallel_size) + ')' if args.virtual_pipeline_model_parallel_size else ''}"
                f"{' x CP ' + str(args.context_parallel_size) if args.context_parallel_size > 1 else ''}"
                f" x DP {args.data_parallel_size}, EP {args.expert_model_parallel_size} | {args.model}"
                f" {num_params / 1e6:.2f}M params | {args.num_microbatches} micro-batches of {args.micro_batch_size}"
                + (" (global batch ramped up from {} by {} over {} samples)".format(*args.rampup_batch_size)
                   if args.rampup_batch_size else ""))
    for line in args.run_plan.lines:
        print_rank0(rank, line)

    state = RunState()
    if args.moe_use_upcycling:  # Megatron-LM: the dense --load becomes this MoE model, saved at 1; training from 0
        from mtmegatron.training.checkpoint.upcycling import upcycle

        upcycle(args, model, optimizer, scheduler, rank)
    elif args.load:
        fresh = checkpoint_dirs.latest_complete_iteration(args.load) is None  # then load() says it starts over
        state.start = checkpointing.load(args.load, model, optimizer, scheduler, args, state.train_state)
        if state.start > 0 or not fresh:
            print_rank0(rank, f"mtmegatron: loaded {args.load}"  # with --lora-load, the iteration is the adapters'
                        + (f" with the adapters of {args.lora_load}" if args.lora_load else "")
                        + f" (continuing at iteration {state.start})")
    if args.ckpt_convert_format:  # Megatron-LM's conversion: save what was loaded in that format, then exit
        checkpointing.save(os.path.join(args.ckpt_convert_save, args.ckpt_convert_format), state.start, model,
                           optimizer, scheduler, args, state.train_state)
        print_rank0(rank, f"> converted checkpoint: {args.ckpt_format} -> {args.ckpt_convert_format}.")
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
        return 0

    gbs = args.global_batch_size
    # the data position is the consumed-sample count (training/data.py); --train-samples counts from it too
    plan = SamplePlan(Batches.of(args), args.data_parallel_size, state.start, state.train_state["consumed_train_samples"])
    train_end = args.train_iters if args.train_samples is None else plan.last_iteration_within(args.train_samples)
    num_samples = plan.end_of(max(train_end, state.start)) + gbs
    dataset, valid = task.datasets(rank, plan, num_samples, data)  # and their start-up lines
    task.start(model, data)
    step = task.step(data)  # what the schedule runs: forward step and loss, shape, reader
    dp_rank = parallel_state.get_data_parallel_rank()
    iterators = [step.micro_batches(dataset, dp_rank, state.start, plan.consumed) for _ in model]

    tensorboard_dir = args.tensorboard_dir or os.path.join(args.log_dir, "tensorboard")
    writer = MetricsWriter(args.log_dir, rank, train_end, args.log_interval, resume=state.start > 0,
                           start=state.start, tensorboard_dir=tensorboard_dir, progress=True,
                           tensorboard_log_interval=args.tensorboard_log_interval,
                           tensorboard_queue_size=args.tensorboard_queue_size)
    state.last = min(train_end, args.exit_interval or train_end)
    train(args, backend, rank, model, optimizer, scheduler, iterators, valid, writer, state, step)
    if state.status == 0:  # after SIGTERM no slow outputs: the launcher's grace period is short
        task.finish(model, data, state.terminated)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return state.status


if __name__ == "__main__":
    if not any(arg.split("=", 1)[0] == "--wandb-project" for arg in sys.argv[1:]):
        leave_out("wandb")  # megatron-core imports it only to know it is there (utils/deferred_imports.py)
    sys.exit(main())
