"""How the decoder layers split over pipeline stages: Megatron-LM's rules for even splits (optionally counting
the embedding and the loss as a layer each), uneven first/last stages, and virtual stages.

megatron-core does the split itself (``get_num_layers_to_build`` / ``get_transformer_layer_offset`` read
``num_layers_in_first/last_pipeline_stage`` and ``account_for_*_in_pipeline_split`` from the config); this module
only refuses, with one message, the combinations it would reject later with an assertion.
May assume: parsed flags with the preset applied; LLaVA's own first-stage rule is in models/families/llava/flags.py.
"""

from __future__ import annotations

import argparse

from mtmegatron.models import families


def check_pipeline_split(args: argparse.Namespace, error) -> None:
    pp, layers = args.pipeline_model_parallel_size, args.num_layers
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    extra = int(args.account_for_embedding_in_pipeline_split) + int(args.account_for_loss_in_pipeline_split)
    if families.of(args).is_multimodal:
        if last is not None or extra:
            raise error("--model llava splits the pipeline with --decoder-first-pipeline-num-layers only")
        return  # llava_args._check_pipeline_split
    if first is None and last is None:
        if (layers + extra) % pp:
            counted = f" (+{extra} for the embedding/loss)" if extra else ""
            raise error(f"--pipeline-model-parallel-size {pp} does not divide --num-layers {layers}{counted}")
        return
    if extra:
        raise error("--account-for-embedding/loss-in-pipeline-split cannot be combined with "
                    "--decoder-first/last-pipeline-num-layers (as in Megatron-LM)")
    if pp < 2:
        raise error("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size >= 2")
    if args.num_layers_per_virtual_pipeline_stage is not None:
        raise error("uneven pipeline stages with virtual stages: use --num-virtual-stages-per-pipeline-rank "
                    "(as Megatron-LM requires) — not supported here yet")
    middle = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if rest < 0 or (middle == 0 and rest) or (middle and (rest == 0 or rest % middle)):
        raise error(f"--decoder-first/last-pipeline-num-layers ({first}/{last}): the other {rest} of {layers} "
                    f"layers must split evenly over the {middle} middle stage(s), at least one each")
