"""Wiring FP8 into a megatron-core GPT model: executor choice, layer spec, config fields, first/last layers.

- ``resolve_executor(args)``: the executor for this run (``--fp8-executor``, default the backend's first that
  runs), stored on ``args.fp8_executor_in_use``.
- ``fp8_linears(args)``: the FP8 linear ModuleSpecs (recipe and executor as params) that
  ``models/layer_spec.build_layer_spec`` puts into ``linear_qkv``/``linear_proj``/``linear_fc1``/``linear_fc2``
  (MoE expert and shared-expert MLPs included); None with the transformer_engine executor, whose TE layer
  modules the builder uses instead (``te_config_fields`` hands the recipe to TransformerConfig, so
  megatron-core runs TE's fp8 autocast). Other linears (MLA's LoRA projections, MTP's ``eh_proj``, the
  embedding, the output layer) stay in high precision.
- ``keep_layers_in_bf16(chunk, args)``: ``--first-last-layers-bf16`` on a built model: the FP8 linears of the
  first ``--num-layers-at-start-in-bf16`` and last ``--num-layers-at-end-in-bf16`` transformer layers (global
  layer numbers, so PP/VPP stages agree) run in high precision.
May assume: megatron-core importable; the backend is active (``mtmegatron.active_backend()``).
"""

from __future__ import annotations

from megatron.core.transformer.spec_utils import ModuleSpec

from .executors import select_executor
from .recipes import recipe_from_args

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


def uses_transformer_engine(args) -> bool:
    """Whether this run's linears are TransformerEngine's (FP8 on, executor ``transformer_engine``)."""
    return recipe_from_args(args) is not None and resolve_executor(args) == "transformer_engine"


def fp8_linears(args):
    """``(column, row)`` ModuleSpecs of our FP8 linears for this run's recipe and executor; None without FP8 or
    with the transformer_engine executor (TE's linears run FP8 themselves, driven by ``te_config_fields``)."""
    recipe = recipe_from_args(args)
    if recipe is None or uses_transformer_engine(args):
        return None
    from .linear import Fp8ColumnParallelLinear, Fp8RowParallelLinear

    params = dict(fp8_recipe=recipe, fp8_executor=resolve_executor(args), tp_only_amax_red=args.tp_only_amax_red)
    return (ModuleSpec(module=Fp8ColumnParallelLinear, params=dict(params)),
            ModuleSpec(module=Fp8RowParallelLinear, params=dict(params)))


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
