"""``wrap(chunks, lora, seed)``: freeze a built model's weights and give its target linears adapters (adapter.py).

Called on the model chunks as built (before Float16Module, megatron-core's DDP and the optimizer), so the
frozen base gets no gradient buffer and no optimizer state: DDP and the optimizer skip parameters that need no
gradient. Adapters take the chunk's parameter dtype (with ``--bf16`` the optimizer keeps their fp32 main copy), or stay fp32
with ``--lora-fp32-adapters`` (adapter.py; their checkpoint: patches/float16_optimizer_fp32_params_checkpoint.py).
Targets, by megatron-core's names: ``linear_qkv`` / ``linear_proj`` (self-attention) and ``linear_fc1`` /
``linear_fc2`` (the dense MLP) of every decoder layer; each adapter is named by its global layer number, so
every pipeline layout builds the same adapters. Fused linears (linear_qkv, SwiGLU's linear_fc1) get one A per
part (q, k, v; gate, up), as HF peft's adapters (adapter.py).
May assume: megatron-core 0.16 GPTModel chunks with local linears (``--transformer-impl local``/``mtmegatron``;
TE's fused layer-norm linears take their input before the norm and are refused here, not yet served).
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

from mtmegatron.lora.adapter import LoRA, attach, row_parts
from mtmegatron.lora.section import Lora
from mtmegatron.utils.errors import ConfigError

PATHS = {"linear_qkv": "self_attention.linear_qkv", "linear_proj": "self_attention.linear_proj",
         "linear_fc1": "mlp.linear_fc1", "linear_fc2": "mlp.linear_fc2"}


def targets(chunk, names) -> list[tuple[str, torch.nn.Module]]:
    """(global name, linear) of every target linear of this chunk, e.g. ("layers.3.mlp.linear_fc1", ...)."""
    found = []
    for layer in chunk.decoder.layers:
        for name in names:
            found.append((f"layers.{layer.layer_number - 1}.{PATHS[name]}", layer.get_submodule(PATHS[name])))
    return found


def _kind(module: torch.nn.Module) -> str:
    if not type(module).__name__.startswith("TE"):  # TE's fused layer-norm linears see the input before the norm
        if isinstance(module, ColumnParallelLinear):
            return "column"
        if isinstance(module, RowParallelLinear):
            return "row"
    raise ConfigError(f"--lora-r: {type(module).__name__} layers take no adapters yet; use --transformer-impl local")


def wrap(chunks: list, lora: Lora, seed: int) -> list:
    """The same chunks, frozen, with adapters attached; returns them for ``model = wrap(model, lora, seed)``.
    ``seed`` (the run's ``--seed``) and the global layer name seed each A's draw (adapter.py)."""
    for chunk in chunks:
        for p in chunk.parameters():
            p.requires_grad_(False)
        for name, linear in targets(chunk, lora.lora_target_modules):
            gated = name.endswith("linear_fc1") and chunk.config.gated_linear_unit
            parts = row_parts(name, chunk.config, linear.weight.shape[0])
            attach(linear, LoRA(linear, _kind(linear), lora.lora_r, lora.lora_alpha, lora.lora_dropout, name,
                                seed, gated=gated, parts=parts, fp32=lora.lora_fp32_adapters))
    return chunks


def adapters(chunks) -> list[tuple[str, torch.nn.Module, LoRA]]:
    """(global name, base linear, adapter) of every adapter in these chunks."""
    return [(name, linear, linear.lora) for chunk in chunks for name, linear in targets(chunk, list(PATHS))
            if hasattr(linear, "lora")]


def merge(chunks) -> None:
    """Fold each adapter into its base weight shard (``W += scale * B @ A``) and zero B: same outputs, one GEMM."""
    with torch.no_grad():
        for _, linear, lora in adapters(chunks):
            linear.weight.add_(lora.delta().to(linear.weight.dtype))
            lora.lora_b.zero_()
