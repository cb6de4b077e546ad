"""How to split a native-resolution vision-language model (Qwen2-VL, Qwen2.5-VL) over pipeline stages: the vision
tower runs on the first stage, so that stage should hold fewer language layers. ``describe`` is the start-up line
that names the ``--decoder-first-pipeline-num-layers`` balancing the stages' forward FLOPs, and the cost of the split
in use; the user's split (or Megatron-LM's even one) is always what runs — this only advises.

The estimate counts matmul FLOPs of one micro-batch's forward (backward is ~2x each side, so the ratio holds): a
language layer on ``seq_length`` tokens (QKV/output projections, MLP, causal attention scores), and the vision tower
on the patches of the image budget — each sequence's ``seq_length`` tokens all vision tokens of one image (the most
the first stage can be asked to encode; Qwen2.5-VL's windowed layers attend within their window). Layer norms,
rotary embeddings and the loss are left out (a few per cent).
May assume: flags validated with the preset applied (models/families/qwen2_vl/flags.py ran), ``kv_channels`` resolved.
"""

from __future__ import annotations

import argparse
import dataclasses


@dataclasses.dataclass(frozen=True)
class StageSplit:
    vision_in_layers: float  # the vision tower's cost in language layers
    balanced_first: int  # --decoder-first-pipeline-num-layers that minimises the costliest stage
    balanced_costs: tuple[float, ...]  # each stage's cost in language layers under that split
    used_first: int | None  # the split in use (None: even)
    used_costs: tuple[float, ...]


def _dense_layer_flops(tokens: int, hidden: int, ffn: int, heads: int, groups: int, head_dim: int, swiglu: bool,
                       attended: float) -> float:
    """Forward matmul FLOPs of one transformer layer over ``tokens`` tokens, each attending to ``attended`` keys."""
    projections = hidden * head_dim * (2 * heads + 2 * groups)
    mlp = (3 if swiglu else 2) * hidden * ffn
    return 2.0 * tokens * (projections + mlp) + 4.0 * tokens * attended * heads * head_dim


def language_layer_flops(args: argparse.Namespace, attention: bool = True) -> float:
    """One language layer's forward on a micro-batch (``attention=False``: its matmuls outside attention)."""
    s = args.seq_length
    return _dense_layer_flops(args.micro_batch_size * s, args.hidden_size, args.ffn_hidden_size,
                              args.num_attention_heads, args.num_query_groups or args.num_attention_heads,
                              args.kv_channels, args.swiglu, attended=(s + 1) / 2 if attention else 0)


def vision_tower_flops(args: argparse.Namespace, attention: bool = True) -> float:
    """The vision tower's forward on the image budget (patch embedding, layers, merger)."""
    merge = args.vision_spatial_merge_size
    tokens = args.micro_batch_size * args.seq_length  # merged vision tokens: the budget above
    patches = tokens * merge * merge
    per_image = args.seq_length * merge * merge
    hidden, heads = args.vision_hidden_size, args.vision_num_attention_heads
    window = args.vision_window_size
    full_layers = set(args.vision_full_attention_layers or []) if window else set(range(args.vision_num_layers))
    window_patches = min(per_image, (window // args.patch_dim) ** 2) if window else per_image
    total = 0.0
    for layer in range(args.vision_num_layers):
        attended = (per_image if layer in full_layers else window_patches) if attention else 0
        total += _dense_layer_flops(patches, hidden, args.vision_ffn_hidden_size, heads, heads, hidden // heads,
                                    args.vision_swiglu, attended)
    in_channels = 3 * args.vision_temporal_patch_size * args.patch_dim ** 2
    merged = hidden * merge * merge
    return total + 2.0 * patches * in_channels * hidden + 2.0 * tokens * (merged * merged + merged * args.hidden_size)


def _stage_costs(first: int | None, layers: int, pp: int, vision: float) -> tuple[float, ...]:
    if first is None:
        per = [layers // pp] * pp
    else:
        per = [first] + [(layers - first) // (pp - 1)] * (pp - 1)
    return tuple([vision + per[0]] + [float(n) for n in per[1:]])


def stage_split(args: argparse.Namespace) -> StageSplit:
    layers, pp = args.num_layers, args.pipeline_model_parallel_size
    vision = vision_tower_flops(args) / language_layer_flops(args)
    candidates = [f for f in range(1, layers - (pp - 1) + 1) if (layers - f) % (pp - 1) == 0]
    balanced = min(candidates, key=lambda f: (max(_stage_costs(f, layers, pp, vision)), -f))
    used = args.decoder_first_pipeline_num_layers
    return StageSplit(vision, balanced, _stage_costs(balanced, layers, pp, vision), used,
                      _stage_costs(used, layers, pp, vision))


def describe(args: argparse.Namespace) -> str | None:
    """The start-up line for a packed-vision model under pipeline parallelism (None otherwise)."""
    if args.pipeline_model_parallel_size < 2 or args.decoder_last_pipeline_num_layers is not None:
        return None
    split = stage_split(args)

    def costs(values: tuple[float, ...]) -> str:
        return "/".join(f"{v:.1f}" for v in values)

    used = ("Megatron-LM's even split" if split.used_first is None
            else f"--decoder-first-pipeline-num-layers {split.used_first}")
    if args.virtual_pipeline_model_parallel_size or args.num_layers_per_virtual_pipeline_stage:
        return (f"pipeline stages (forward FLOPs, every sequence all vision tokens of one image): the vision tower "
                f"in stage 0's first virtual chunk costs {split.vision_in_layers:.1f} language layers; per pipeline "
                f"rank {costs(split.used_costs)} language layers (uneven splits with virtual stages are not "
                f"supported here)")
    advice = ("the balanced one" if split.used_first == split.balanced_first
              else f"--decoder-first-pipeline-num-layers {split.balanced_first} would balance them "
                   f"({costs(split.balanced_costs)})")
    return (f"pipeline stages (forward FLOPs, every sequence all vision tokens of one image): the vision tower on "
            f"stage 0 costs {split.vision_in_layers:.1f} language layers; {used} gives stage costs "
            f"{costs(split.used_costs)} language layers — {advice}")
