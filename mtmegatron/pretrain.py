"""``torchrun --nproc_per_node N -m mtmegatron.pretrain [Megatron-LM flags]``: pretrain a GPT-style model.

Flags are validated and the backend selected before any process group starts; a user mistake exits with
status 2 and one message. See training/ for the pieces.
May assume: launched by torchrun (or as a single plain process).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings

from mtmegatron.backends import BackendUnavailableError, select_backend
from mtmegatron.training.arguments import parse_args
from mtmegatron.training.errors import ConfigError, exit_with_user_error


def _fail(message: str) -> None:
    exit_with_user_error(message)


def _quiet_known_noise() -> None:
    """Silence notices that repeat on every rank and say nothing actionable on a run that works."""
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed", category=UserWarning)
    warnings.filterwarnings("ignore", message=r".*is deprecated. Please use `torch.distributed", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"full scope is deprecated", category=UserWarning)
    logging.getLogger("megatron.core.datasets").setLevel(logging.ERROR)


def main(argv=None) -> int:
    _quiet_known_noise()
    try:
        args = parse_args(argv)
        backend = select_backend(args.backend)
    except (ConfigError, BackendUnavailableError) as e:
        _fail(str(e))
    import mtmegatron
    from mtmegatron.patches import UnsupportedMegatronVersion

    if backend.device_type == "cpu":  # there are no CUDA connections to tune on the host
        warnings.filterwarnings("ignore", message=r".*CUDA_DEVICE_MAX_CONNECTIONS", category=UserWarning)

    try:
        mtmegatron.activate(backend)
    except UnsupportedMegatronVersion as e:
        _fail(str(e))
    if args.fp8_format:  # the FP8 executor depends on the active backend
        from mtmegatron.fp8.spec import resolve_executor

        try:
            resolve_executor(args)
        except ValueError as e:
            _fail(str(e))
    from mtmegatron.data.resolve import resolve_data
    from mtmegatron.training.checkpointing import CheckpointError

    try:
        tokenizer = resolve_data(args, progress=int(os.environ.get("RANK", "0")) == 0)
    except ConfigError as e:
        _fail(str(e))
    try:
        return run(args, backend, tokenizer)
    except CheckpointError as e:
        _fail(str(e))


def run(args, backend, tokenizer=None) -> int:
    import torch
    from megatron.core import parallel_state

    from mtmegatron.training import checkpointing, placement, robustness
    from mtmegatron.training.device import compute_device
    from mtmegatron.training.data import build_gpt_datasets, build_mock_dataset, micro_batches
    from mtmegatron.training.evaluate import validation_loss
    from mtmegatron.training.finish import write_outputs
    from mtmegatron.training.loop import train_step
    from mtmegatron.training.metrics import MetricsWriter, print_rank0
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
                f" {num_params / 1e6:.2f}M params | {args.num_microbatches} micro-batches of {args.micro_batch_size}")
    from mtmegatron.ops import native

    print_rank0(rank, f"mtmegatron: {native.status(backend.device_type)}")
    if args.fp8_format:
        from mtmegatron.fp8.spec import describe

        print_rank0(rank, describe(args))

    start = 0
    train_state = {"skipped_steps": 0}
    if args.load:
        start = checkpointing.load(args.load, model, optimizer, scheduler, args, train_state)
        print_rank0(rank, f"mtmegatron: loaded {args.load} (continuing at iteration {start})")

    gbs = args.global_batch_size
    num_samples = (args.train_iters + 1) * gbs
    valid = None
    if args.mock_data:
        dataset = build_mock_dataset(args, num_samples)
    else:
        dataset, valid = build_gpt_datasets(args, num_samples, args.eval_iters * gbs or None, tokenizer)
        print_rank0(rank, f"mtmegatron: data {' '.join(args.data_path)} | {len(dataset)} train samples"
                    f"{f', {len(valid)} valid' if valid is not None else ', no validation split'}"
                    f" | tokenizer {tokenizer.source} ({tokenizer.vocab_size} tokens)")
    dp_rank = parallel_state.get_data_parallel_rank()
    iterators = [micro_batches(dataset, args, dp_rank, start) for _ in model]
    evaluate = valid is not None and args.eval_iters > 0 and args.eval_interval

    tensorboard_dir = args.tensorboard_dir or os.path.join(args.log_dir, "tensorboard")
    writer = MetricsWriter(args.log_dir, rank, args.train_iters, args.log_interval, resume=start > 0, start=start,
                           tensorboard_dir=tensorboard_dir, progress=True)
    termination = robustness.TerminationRequest()
    tokens_per_step = gbs * args.seq_length
    last = min(args.train_iters, args.exit_interval or args.train_iters)
    saved_at = None
    status = 0
    terminated = False
    try:
        for iteration in range(start + 1, last + 1):
            args.iteration = iteration
            t0 = time.perf_counter()
            stats = train_step(iterators, model, optimizer, scheduler, args)
            elapsed = time.perf_counter() - t0
            if iteration == start + 1 and backend.device_type != "cpu":  # the optimizer state exists now
                device = compute_device()
                checked = placement.check(model, optimizer, device)
                print_rank0(rank, f"mtmegatron: placement: all {checked} parameters, buffers, gradient buffers "
                            f"and optimizer states on {device}")
            train_state["skipped_steps"] += int(stats["skipped"])
            row = {"iteration": iteration, **stats, "tokens_per_sec": tokens_per_step / elapsed,
                   "step_time_ms": elapsed * 1000.0, "skipped_steps": train_state["skipped_steps"]}
            if evaluate and (iteration % args.eval_interval == 0 or iteration == last):
                row["val_loss"] = validation_loss(valid, model, args)
            writer.log(row)
            if args.max_skipped_steps is not None and train_state["skipped_steps"] > args.max_skipped_steps:
                print_rank0(rank, f"mtmegatron: error: {train_state['skipped_steps']} steps skipped for inf/nan "
                            f"loss or gradients (more than --max-skipped-steps {args.max_skipped_steps}); "
                            f"stopping at iteration {iteration}")
                status, last = 1, iteration
                break
            if args.save and args.save_interval and iteration % args.save_interval == 0:
                checkpointing.save(args.save, iteration, model, optimizer, scheduler, args, train_state)
                saved_at = iteration
            if termination.requested():
                print_rank0(rank, f"mtmegatron: SIGTERM received: stopping after iteration {iteration}"
                            f"{'' if args.save else ' (no --save given: no checkpoint written)'}")
                last, terminated = iteration, True
                break
        if status == 0 and args.save and saved_at != last and (last > start or last == 0):  # 0: initial ckpt
            path = checkpointing.save(args.save, last, model, optimizer, scheduler, args, train_state)
            print_rank0(rank, f"mtmegatron: saved {path}")
    finally:
        writer.close()
        termination.restore()
    if status == 0:  # after SIGTERM no sampling: the launcher's grace period is short
        write_outputs(model, None if terminated else tokenizer, args)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
