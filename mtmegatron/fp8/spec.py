"""Wiring FP8 into a megatron-core GPT model: executor choice, layer spec, config fields, first/last layers.

- ``resolve_executor(args)``: the executor for this run (``--fp8-executor``, default the backend's first that
  runs), stored on ``args.fp8_executor_in_use``.
- ``apply_fp8_to_spec(spec, args)``: with the transformer_engine executor, megatron-core's TE layer spec (and
  ``te_config_fields`` hands the recipe to TransformerConfig, so megatron-core runs TE's fp8 autocast);
  otherwise the given spec with every megatron ``ColumnParallelLinear``/``RowParallelLinear`` in
  ``linear_qkv``/``linear_proj``/``linear_fc1``/``linear_fc2`` swapped for our FP8 layers, walking a single
  layer ``ModuleSpec`` or a ``TransformerBlockSubmodules`` with ``layer_specs`` (MoE expert and shared-expert
  MLPs included). Other linear classes (the embedding, the output layer) stay in high precision.
- ``keep_layers_in_bf16(chunk, args)``: ``--first-last-layers-bf16`` on a built model: the FP8 linears of the
  first ``--num-layers-at-start-in-bf16`` and last ``--num-layers-at-end-in-bf16`` transformer layers (global
  layer numbers, so PP/VPP stages agree) run in high precision.
May assume: megatron-core importable; the backend is active (``mtmegatron.active_backend()``).
"""

from __future__ import annotations

import dataclasses

from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.spec_utils import ModuleSpec

from .executors import select_executor
from .recipes import recipe_from_args

LINEAR_FIELDS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def resolve_executor(args) -> str | None:
    if not getattr(args, "fp8_format", None):
        return None
    if getattr(args, "fp8_executor_in_use", None) is None:
        import mtmegatron

        args.fp8_executor_in_use = select_executor(mtmegatron.active_backend(), args.fp8_executor)
    return args.fp8_executor_in_use


def te_config_fields(args) -> dict:
    """TransformerConfig FP8 fields, set only for the TransformerEngine executor (megatron-core then drives
    TE itself; for our executors the config stays FP8-free so megatron-core does not look for TE)."""
    if resolve_executor(args) != "transformer_engine":
        return {}
    return dict(fp8=args.fp8_format, fp8_recipe=args.fp8_recipe, fp8_margin=args.fp8_margin,
                fp8_amax_history_len=args.fp8_amax_history_len, fp8_amax_compute_algo=args.fp8_amax_compute_algo,
                tp_only_amax_red=args.tp_only_amax_red, first_last_layers_bf16=args.first_last_layers_bf16,
                num_layers_at_start_in_bf16=args.num_layers_at_start_in_bf16,
                num_layers_at_end_in_bf16=args.num_layers_at_end_in_bf16)


def _swap(node, swaps: dict):
    """A copy of a spec tree with the linear classes in ``swaps`` replaced (by ModuleSpecs with params)."""
    if isinstance(node, ModuleSpec):
        return dataclasses.replace(node, submodules=_swap(node.submodules, swaps))
    if isinstance(node, list):
        return [_swap(item, swaps) for item in node]
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changes = {}
        for field in dataclasses.fields(node):
            value = getattr(node, field.name)
            if field.name in LINEAR_FIELDS and isinstance(value, type) and value in swaps:
                changes[field.name] = swaps[value]
            elif isinstance(value, (ModuleSpec, list)) or (dataclasses.is_dataclass(value)
                                                           and not isinstance(value, type)):
                changes[field.name] = _swap(value, swaps)
        return dataclasses.replace(node, **changes)
    return node


def apply_fp8_to_spec(spec, args):
    recipe = recipe_from_args(args)
    if recipe is None:
        return spec
    executor = resolve_executor(args)
    if executor == "transformer_engine":  # megatron-core's own TE path (unverified here: no TE on CPU)
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(num_experts=args.num_experts, moe_grouped_gemm=False)
    from .linear import Fp8ColumnParallelLinear, Fp8RowParallelLinear

    params = dict(fp8_recipe=recipe, fp8_executor=executor, tp_only_amax_red=args.tp_only_amax_red)
    swaps = {ColumnParallelLinear: ModuleSpec(module=Fp8ColumnParallelLinear, params=params),
             RowParallelLinear: ModuleSpec(module=Fp8RowParallelLinear, params=params)}
    return _swap(spec, swaps)


def keep_layers_in_bf16(chunk, args) -> None:
    if not getattr(args, "fp8_format", None) or not args.first_last_layers_bf16:
        return
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from .linear import _Fp8LinearMixin

    first, last = args.num_layers_at_start_in_bf16, args.num_layers - args.num_layers_at_end_in_bf16
    for layer in chunk.modules():
        if isinstance(layer, TransformerLayer) and (layer.layer_number <= first or layer.layer_number > last):
            for module in layer.modules():
                if isinstance(module, _Fp8LinearMixin):
                    module.fp8 = None


def describe(args) -> str:
    """The start-up line naming recipe, format and executor."""
    recipe = recipe_from_args(args)
    bf16_layers = (f", first {args.num_layers_at_start_in_bf16}/last {args.num_layers_at_end_in_bf16} layers in "
                   "high precision" if args.first_last_layers_bf16 else "")
    return (f"mtmegatron: FP8 {recipe.name} recipe, {args.fp8_format} format, executor {resolve_executor(args)}"
            f"{bf16_layers}")
