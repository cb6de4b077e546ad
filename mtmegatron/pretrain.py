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
from mtmegatron.training.arguments import ConfigError, parse_args


def _fail(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"mtmegatron.pretrain: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


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
    from mtmegatron.training.checkpointing import CheckpointError

    try:
        return run(args, backend)
    except CheckpointError as e:
        _fail(str(e))


def run(args, backend) -> int:
    import torch
    from megatron.core import parallel_state

    from mtmegatron.training import checkpointing
    from mtmegatron.training.data import build_mock_dataset, micro_batches
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
    if args.fp8_format:
        from mtmegatron.fp8.spec import describe

        print_rank0(rank, describe(args))

    start = 0
    if args.load:
        start = checkpointing.load(args.load, model, optimizer, scheduler, args)
        print_rank0(rank, f"mtmegatron: loaded {args.load} (continuing at iteration {start})")

    num_samples = (args.train_iters + 1) * args.global_batch_size
    dataset = build_mock_dataset(args, num_samples)
    dp_rank = parallel_state.get_data_parallel_rank()
    iterators = [micro_batches(dataset, args, dp_rank, start) for _ in model]

    writer = MetricsWriter(args.log_dir, rank, args.train_iters, args.log_interval, resume=start > 0)
    tokens_per_step = args.global_batch_size * args.seq_length
    last = min(args.train_iters, args.exit_interval or args.train_iters)
    saved_at = None
    try:
        for iteration in range(start + 1, last + 1):
            t0 = time.perf_counter()
            stats = train_step(iterators, model, optimizer, scheduler, args)
            elapsed = time.perf_counter() - t0
            writer.log({
                "iteration": iteration,
                **stats,
                "tokens_per_sec": tokens_per_step / elapsed,
                "step_time_ms": elapsed * 1000.0,
            })
            if args.save and args.save_interval and iteration % args.save_interval == 0:
                checkpointing.save(args.save, iteration, model, optimizer, scheduler, args)
                saved_at = iteration
        if args.save and saved_at != last and (last > start or last == 0):  # 0: an initial checkpoint
            path = checkpointing.save(args.save, last, model, optimizer, scheduler, args)
            print_rank0(rank, f"mtmegatron: saved {path}")
    finally:
        writer.close()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
