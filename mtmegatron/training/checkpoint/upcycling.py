"""``--moe-use-upcycling`` (with ``--moe-upcycling-granularity``), Megatron-LM 0.16.1's meaning: the ``--load``
checkpoint of a dense model becomes the starting point of this run's MoE model. The dense model is built from the
same flags with no experts, expert-parallel size 1 and ``--ffn-hidden-size`` x granularity, loaded with the
project's loader, and megatron-core's ``upcycling_utils`` copies (and, for granularity > 1, splits) its MLP into
every expert and the router; the result is saved to ``--save`` at iteration 1 and training starts from it.

The flags are checked at parse time (config/checkpoint_flags.check_upcycling_args, before any process group):
``--save`` must be given and hold no checkpoint, ``--load`` and ``--num-experts`` must be given;
``--no-load-optim`` and ``--no-load-rng`` are forced.
May assume: ``upcycle`` runs after training/setup.py ``build`` on every rank, with the process groups up.
"""

from __future__ import annotations

import copy


def upcycle(args, model, optimizer, scheduler, rank: int) -> None:
    """Load the dense ``--load`` checkpoint, upcycle it into ``model`` (DDP-wrapped MoE chunks) and save it to
    ``--save`` at iteration 1, as Megatron-LM's ``setup_model_and_optimizer`` does."""
    import torch
    from megatron.core.transformer.moe import upcycling_utils

    from mtmegatron.models.gpt import build_model_chunks, transformer_config
    from mtmegatron.training.checkpoint import checkpointing
    from mtmegatron.backends.device import compute_device, move_module
    from mtmegatron.utils.metrics import print_rank0

    if args.upcycling_note:
        print_rank0(rank, f"mtmegatron: {args.upcycling_note}")
    dense_args = copy.copy(args)  # the dense twin's flags (args itself is read-only)
    dense_args.num_experts, dense_args.expert_model_parallel_size, dense_args.moe_ffn_hidden_size = None, 1, None
    dense_args.ffn_hidden_size = args.ffn_hidden_size * args.moe_upcycling_granularity
    dense = build_model_chunks(dense_args, transformer_config(dense_args))
    for chunk in dense:
        move_module(chunk, compute_device())
    checkpointing.load(args.load, dense, None, None, dense_args)
    unwrapped = [_unwrap(chunk) for chunk in model]
    upcycling_utils.load_and_upcycle_model(lambda: (None, 0), unwrapped, dense)
    del dense
    optimizer.reload_model_params()  # the fp32 main copies follow the upcycled weights
    saved_args = copy.copy(args)
    saved_args.no_save_optim = True  # Megatron-LM saves the upcycled model without optimizer and schedule
    checkpointing.save(args.save, 1, model, optimizer, scheduler, saved_args)
    torch.distributed.barrier()
    print_rank0(rank, f"Upcycled checkpoint saved to {args.save}")


def _unwrap(chunk):
    """The GPTModel inside the DDP / Float16Module wrappers (megatron-core's upcycling reads its submodules)."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk
