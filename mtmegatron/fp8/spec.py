"""Wiring FP8 into a megatron-core GPT model: executor choice, layer spec, config fields, first/last layers.

Every function takes the FP8 flags as the ``Fp8`` section (fp8/section.py) and, where it matters, the executor in
use and whether the layers are TransformerEngine's as plain values: those two are decided after parsing, not
flags (the caller holds them: models/section.py ``LayerChoice``).
- ``choose_executor(fp8, transformer_engine, local_rank)``: at start-up (pretrain.prepare), once: the executor for
  this run (``--fp8-executor``, default the backend's first that runs; ``scaled_mm`` probed on the rank's device,
  set first) and the start-up note, or None; a block-scaled recipe ``scaled_mm`` cannot run in one call per GEMM on
  this device runs ``emulated``, said in the note. pretrain records both on the run's values (``fp8_executor_in_use``,
  ``fp8_executor_note``).
- ``fp8_linears(fp8, executor, transformer_engine)``: the FP8 linear ModuleSpecs (recipe and executor as params)
  that ``models/layer_spec.build_layer_spec`` puts into ``linear_qkv``/``linear_proj``/``linear_fc1``/``linear_fc2``
  (MoE expert and shared-expert MLPs included); None with TransformerEngine's layers, whose modules the builder
  uses instead (``te_config_fields`` hands the recipe to TransformerConfig, so megatron-core runs TE's fp8
  autocast). Other linears (MLA's LoRA projections, MTP's ``eh_proj``, the embedding, the output layer) stay in
  high precision.
- ``keep_layers_in_bf16(chunk, fp8, num_layers)``: ``--first-last-layers-bf16`` on a built model: the FP8 linears
  of the first ``--num-layers-at-start-in-bf16`` and last ``--num-layers-at-end-in-bf16`` transformer layers
  (global layer numbers, so PP/VPP stages agree) run in high precision.
May assume: megatron-core importable; the backend is active (``active_backend()``) when an executor is chosen.
"""

from __future__ import annotations

from megatron.core.transformer.spec_utils import ModuleSpec

from .probe import executor_missing, scaled_mm_support, select_executor
from .recipes import recipe_of
from .section import Fp8

BLOCK_SCALED = ("blockwise", "mxfp8")


def choose_executor(fp8: Fp8, transformer_engine: bool, local_rank: int | None = None) -> tuple[str, str | None]:
    """(executor, the start-up note or None): see the module docstring. ``transformer_engine``: the layers are
    TransformerEngine's (decided at parse time, config/transformer_impl.py); ``local_rank``: the device to probe."""
    from mtmegatron.backends.active import active_backend

    backend = active_backend()
    if local_rank is not None:
        backend.set_device(local_rank)
    if transformer_engine:  # parse time chose TE's layers, so TE's executor (or its refusal)
        executor = select_executor(backend, "transformer_engine")
    else:
        executor = select_executor(backend, fp8.fp8_executor, skip=("transformer_engine",))
    note = None
    if executor == "emulated" and fp8.fp8_executor == "auto" and "scaled_mm" in backend.fp8_executors:
        note = f"scaled_mm does not run here: {executor_missing('scaled_mm', backend)}"
    recipe = recipe_of(fp8)
    if executor == "scaled_mm" and recipe.name in BLOCK_SCALED:
        why = ("mtmegatron passes no MX (E8M0, swizzled) scales to torch._scaled_mm" if recipe.name != "blockwise"
               else scaled_mm_support(backend.facts()).blockwise_missing)
        if why:
            executor, note = "emulated", f"scaled_mm runs no {recipe.name} GEMM here ({why}): its GEMMs are emulated"
    return executor, note


def te_config_fields(fp8: Fp8, executor: str | None) -> dict:
    """TransformerConfig FP8 fields, set only for the TransformerEngine executor (megatron-core then drives
    TE itself; for our executors the config stays FP8-free so megatron-core does not look for TE)."""
    if executor != "transformer_engine":
        return {}
    return dict(fp8=fp8.fp8, fp8_recipe=fp8.fp8_recipe, fp8_margin=fp8.fp8_margin,
                fp8_amax_history_len=fp8.fp8_amax_history_len, fp8_amax_compute_algo=fp8.fp8_amax_compute_algo,
                tp_only_amax_red=fp8.tp_only_amax_red, first_last_layers_bf16=fp8.first_last_layers_bf16,
                num_layers_at_start_in_bf16=fp8.num_layers_at_start_in_bf16,
                num_layers_at_end_in_bf16=fp8.num_layers_at_end_in_bf16)


def fp8_linears(fp8: Fp8, executor: str | None, transformer_engine: bool):
    """``(column, row)`` ModuleSpecs of our FP8 linears for this run's recipe and executor; None without FP8 or
    with TransformerEngine's layers (TE's linears run FP8 themselves, driven by ``te_config_fields``)."""
    recipe = recipe_of(fp8)
    if recipe is None or transformer_engine:
        return None
    from .linear import Fp8ColumnParallelLinear, Fp8RowParallelLinear

    params = dict(fp8_recipe=recipe, fp8_executor=executor, tp_only_amax_red=fp8.tp_only_amax_red)
    return (ModuleSpec(module=Fp8ColumnParallelLinear, params=dict(params)),
            ModuleSpec(module=Fp8RowParallelLinear, params=dict(params)))


def keep_layers_in_bf16(chunk, fp8: Fp8, num_layers: int) -> None:
    """``num_layers``: the model's transformer layers (all stages)."""
    if not fp8.fp8 or not fp8.first_last_layers_bf16:
        return
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from .linear import _Fp8LinearMixin

    first, last = fp8.num_layers_at_start_in_bf16, num_layers - fp8.num_layers_at_end_in_bf16
    for layer in chunk.modules():
        if isinstance(layer, TransformerLayer) and (layer.layer_number <= first or layer.layer_number > last):
            for module in layer.modules():
                if isinstance(module, _Fp8LinearMixin):
                    module.fp8 = None


def describe(fp8: Fp8, executor: str | None, note: str | None) -> str:
    """The start-up line naming recipe, format and executor (``note``: ``choose_executor``'s)."""
    recipe = recipe_of(fp8)
    bf16_layers = (f", first {fp8.num_layers_at_start_in_bf16}/last {fp8.num_layers_at_end_in_bf16} layers in "
                   "high precision" if fp8.first_last_layers_bf16 else "")
    note = f" ({note})" if note else ""
    return f"mtmegatron: FP8 {recipe.name} recipe, {fp8.fp8} format, executor {executor}{note}{bf16_layers}"
