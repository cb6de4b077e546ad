"""Grouped-GEMM MoE experts (``--moe-grouped-gemm``): which experts module a MoE layer gets (the flags and their
checks are config/moe_flags.py's).

- Without ``--moe-grouped-gemm``: megatron-core's ``SequentialMLP`` (one MLP per local expert).
- With it, on TransformerEngine layers: megatron-core's ``TEGroupedMLP`` over TE's grouped linears (as Megatron-LM
  does), unless ``--moe-use-legacy-grouped-gemm``.
- Elsewhere (local / mtmegatron layers, or the legacy flag): megatron-core's ``GroupedMLP``, whose grouped matmul
  is served by ``mtmegatron.ops.grouped_mm`` (``torch._grouped_mm`` where the installed torch has it for the
  device, else one matmul per expert) through the ``grouped_gemm_ops`` patch.
Every choice keeps megatron-core's ``sharded_state_dict``: a torch_dist checkpoint written with one experts
module loads into the others (weights; the optimizer state does not convert, see ``check_resume``).
May assume: validated flags; megatron-core 0.16.
"""

from __future__ import annotations

import importlib

from mtmegatron.backends.base import installed_transformer_engine

# megatron-core's modules are imported where used: the training parser imports this module (through
# models/layer_spec.py callers), and its imports must stay light (pretrain silences megatron-core's import-time
# notices only after parsing has begun)
TE_MODULE = "megatron.core.extensions.transformer_engine"


def te_module(name: str):
    """megatron-core's TE class ``name`` when TransformerEngine is installed (megatron's MLA compares by identity
    with ``TELinear``), else a ModuleSpec naming it, imported only when the module is built."""
    if installed_transformer_engine() is None:
        from megatron.core.transformer.spec_utils import ModuleSpec

        return ModuleSpec(module=(TE_MODULE, name))
    return getattr(importlib.import_module(TE_MODULE), name)


def expert_modules(layer_modules, moe_use_grouped_gemm: bool, moe_use_legacy_grouped_gemm: bool):
    """(experts class, its submodules) for a layer whose modules are ``layer_modules`` (layer_spec.LayerModules):
    megatron-core's BackendSpecProvider.grouped_mlp_modules answer for our providers."""
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import GroupedMLP, SequentialMLP, TEGroupedMLP

    if not moe_use_grouped_gemm:
        return SequentialMLP, MLPSubmodules(linear_fc1=layer_modules.column, linear_fc2=layer_modules.row)
    if layer_modules.transformer_engine and not moe_use_legacy_grouped_gemm:
        return TEGroupedMLP, MLPSubmodules(linear_fc1=te_module("TEColumnParallelGroupedLinear"),
                                           linear_fc2=te_module("TERowParallelGroupedLinear"))
    return GroupedMLP, None


def describe(num_experts: int | None, moe_grouped_gemm: bool, moe_use_legacy_grouped_gemm: bool,
             layer_modules) -> str:
    """The experts part of the start-up line ('' for a dense model; the flags of the same names)."""
    if not num_experts:
        return ""
    from megatron.core.transformer.moe.experts import GroupedMLP

    module, _ = expert_modules(layer_modules, moe_grouped_gemm, moe_use_legacy_grouped_gemm)
    if module is GroupedMLP:
        return " | experts GroupedMLP (grouped matmul: torch._grouped_mm where the device has it, else per expert)"
    return f" | experts {module.__name__}"
