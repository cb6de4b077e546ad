"""Wiring FP8 into a megatron-core GPT model: executor choice, layer spec, config fields, first/last layers.

- ``resolve_executor(args, local_rank)``: at start-up (pretrain.prepare), once: the executor for this run
  (``--fp8-executor``, default the backend's first that runs; ``scaled_mm`` probed on the rank's device, set
  first), recorded in ``args.fp8_executor_in_use``; a block-scaled recipe ``scaled_mm`` cannot run in one call per
  GEMM on this device runs ``emulated``, said in the start-up line (``args.fp8_executor_note``).
  ``executor_in_use(args)`` reads it (and writes nothing).
- ``fp8_linears(args)``: the FP8 linear ModuleSpecs (recipe and executor as params) that
  ``models/layer_spec.build_layer_spec`` puts into ``linear_qkv``/``linear_proj``/``linear_fc1``/``linear_fc2``
  (MoE expert and shared-expert MLPs included); None with the transformer_engine executor, whose TE layer
  modules the builder uses instead (``te_config_fields`` hands the recipe to TransformerConfig, so
  megatron-core runs TE's fp8 autocast). Other linears (MLA's LoRA projections, MTP's ``eh_proj``, the
  embedding, the output layer) stay in high precision.
- ``keep_layers_in_bf16(chunk, args)``: ``--first-last-layers-bf16`` on a built model: the FP8 linears of the
  first ``--num-layers-at-start-in-bf16`` and last ``--num-layers-at-end-in-bf16`` transformer layers (global
  layer numbers, so PP/VPP stages agree) run in high precision.
May assume: megatron-core importable; the backend is active (``active_backend()``).
"""

from __future__ import annotations

from megatron.core.transformer.spec_utils import ModuleSpec

from .probe import executor_missing, scaled_mm_support, select_executor
from .recipes import recipe_from_args

BLOCK_SCALED = ("blockwise", "mxfp8")


def resolve_executor(args, local_rank: int | None = None) -> str | None:
    """Choose the executor and record it; ``local_rank``: set first, so ``scaled_mm`` is probed on the rank's device."""
    if args.fp8_format:
        args.fp8_executor_in_use, args.fp8_executor_note = choose_executor(args, local_rank)
    return executor_in_use(args)


def executor_in_use(args) -> str | None:
    """The recorded executor; chosen again (not recorded) where start-up did not resolve it."""
    if not args.fp8_format:
        return None
    return args.fp8_executor_in_use or choose_executor(args)[0]


def choose_executor(args, local_rank: int | None = None) -> tuple[str, str | None]:
    """(executor, the start-up note or None): see the module docstring."""
    from mtmegatron.backends.active import active_backend

    backend = active_backend()
    if local_rank is not None:
        backend.set_device(local_rank)
    if args.transformer_engine_layers:  # parse time chose TE's layers, so TE's executor (or its refusal)
        executor = select_executor(backend, "transformer_engine")
    else:
        executor = select_executor(backend, args.fp8_executor, skip=("transformer_engine",))
    note = None
    if executor == "emulated" and args.fp8_executor == "auto" and "scaled_mm" in backend.fp8_executors:
        note = f"scaled_mm does not run here: {executor_missing('scaled_mm', backend)}"
    recipe = recipe_from_args(args)
    if executor == "scaled_mm" and recipe.name in BLOCK_SCALED:
        why = ("mtmegatron passes no MX (E8M0, swizzled) scales to torch._scaled_mm" if recipe.name != "blockwise"
               else scaled_mm_support(backend.facts()).blockwise_missing)
        if why:
            executor, note = "emulated", f"scaled_mm runs no {recipe.name} GEMM here ({why}): its GEMMs are emulated"
    return executor, note


def te_config_fields(args) -> dict:
    """TransformerConfig FP8 fields, set only for the TransformerEngine executor (megatron-core then drives
    TE itself; for our executors the config stays FP8-free so megatron-core does not look for TE)."""
    if executor_in_use(args) != "transformer_engine":
        return {}
    return dict(fp8=args.fp8_format, fp8_recipe=args.fp8_recipe, fp8_margin=args.fp8_margin,
                fp8_amax_history_len=args.fp8_amax_history_len, fp8_amax_compute_algo=args.fp8_amax_compute_algo,
                tp_only_amax_red=args.tp_only_amax_red, first_last_layers_bf16=args.first_last_layers_bf16,
                num_layers_at_start_in_bf16=args.num_layers_at_start_in_bf16,
                num_layers_at_end_in_bf16=args.num_layers_at_end_in_bf16)


def uses_transformer_engine(args) -> bool:
    """Whether this run's layers are TransformerEngine's: decided once at parse time
    (``models/transformer_impl.resolve_transformer_impl`` sets ``args.transformer_engine_layers``)."""
    return args.transformer_engine_layers


def fp8_linears(args):
    """``(column, row)`` ModuleSpecs of our FP8 linears for this run's recipe and executor; None without FP8 or
    with the transformer_engine executor (TE's linears run FP8 themselves, driven by ``te_config_fields``)."""
    recipe = recipe_from_args(args)
    if recipe is None or uses_transformer_engine(args):
        return None
    from .linear import Fp8ColumnParallelLinear, Fp8RowParallelLinear

    params = dict(fp8_recipe=recipe, fp8_executor=executor_in_use(args), tp_only_amax_red=args.tp_only_amax_red)
    return (ModuleSpec(module=Fp8ColumnParallelLinear, params=dict(params)),
            ModuleSpec(module=Fp8RowParallelLinear, params=dict(params)))


def keep_layers_in_bf16(chunk, args) -> None:
    if not args.fp8_format or not args.first_last_layers_bf16:
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
    note = f" ({args.fp8_executor_note})" if args.fp8_executor_note else ""
    return (f"mtmegatron: FP8 {recipe.name} recipe, {args.fp8_format} format, executor {executor_in_use(args)}"
            f"{note}{bf16_layers}")
