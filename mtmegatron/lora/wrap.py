"""``wrap(chunks, lora, seed)``: freeze a built model's weights and give its target linears adapters (adapter.py).

Called on the model chunks as built (before Float16Module, megatron-core's DDP and the optimizer), so the
frozen base gets no gradient buffer and no optimizer state: DDP and the optimizer skip parameters that need no
gradient. Adapters take the chunk's parameter dtype (with ``--bf16`` the optimizer keeps their fp32 main copy), or stay fp32
with ``--lora-fp32-adapters`` (adapter.py; their checkpoint: patches/float16_optimizer_fp32_params_checkpoint.py).
Targets, by megatron-core's names: ``linear_qkv`` / ``linear_proj`` (self-attention), MLA's ``linear_q_proj`` /
``linear_q_down_proj`` / ``linear_q_up_proj`` / ``linear_kv_down_proj`` / ``linear_kv_up_proj``, and ``linear_fc1`` /
``linear_fc2``: the dense MLP's, every expert's and the shared experts' (one name for all, as Megatron-Bridge's
peft; sequential experts are linears here, grouped-GEMM experts get stacked adapters, grouped.py) of every
decoder layer; each adapter is named by its global layer number, so
every pipeline layout builds the same adapters. Fused linears (linear_qkv, SwiGLU's linear_fc1) get one A per
part (q, k, v; gate, up), as HF peft's adapters (adapter.py).
May assume: megatron-core 0.16 GPTModel chunks with local linears (``--transformer-impl local``/``mtmegatron``;
TE's fused layer-norm linears take their input before the norm and are refused here, not yet served).
"""

from __future__ import annotations

import re

import torch
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.moe.experts import GroupedMLP

from mtmegatron.lora import grouped
from mtmegatron.lora.adapter import LoRA, attach, row_parts
from mtmegatron.lora.section import Lora
from mtmegatron.utils.errors import ConfigError

MLA = ("linear_q_proj", "linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj")
NAMES = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2") + MLA
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.")


def _global(layer, path: str) -> str:
    """``path`` (in ``layer``) with a sequential expert's local index made global (its EP rank's first + local)."""
    found = _EXPERT.match(path)
    if found is None:
        return path
    experts = layer.mlp.experts
    index = experts.ep_group.rank() * experts.num_local_experts + int(found.group(1))
    return f"mlp.experts.local_experts.{index}." + path[found.end():]


def targets(chunk, names) -> list[tuple[str, torch.nn.Module]]:
    """(global name, linear) of every target linear of this chunk, e.g. ("layers.3.mlp.linear_fc1", ...): a
    linear whose own name is in ``names``, wherever it sits in a decoder layer (Megatron-Bridge's rule:
    ``linear_fc1`` is the dense MLP's, every sequential expert's (global index) and the shared experts'); a
    GroupedMLP is served by grouped.py and not listed here."""
    found = []
    for layer in chunk.decoder.layers:
        for path, module in layer.named_modules():
            if path.rsplit(".", 1)[-1] in names and ".lora" not in path and not isinstance(module, GroupedMLP):
                found.append((f"layers.{layer.layer_number - 1}.{_global(layer, path)}", module))
    return found


def grouped_targets(chunk) -> list[tuple[int, torch.nn.Module]]:
    """(0-based global layer number, GroupedMLP) of every grouped-GEMM experts module of this chunk."""
    return [(layer.layer_number - 1, module) for layer in chunk.decoder.layers for module in layer.modules()
            if isinstance(module, GroupedMLP)]


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
        experts_names = [n for n in lora.lora_target_modules if n in ("linear_fc1", "linear_fc2")]
        for layer, experts in grouped_targets(chunk) if experts_names else ():
            grouped.attach(experts, experts_names, layer, lora.lora_r, lora.lora_alpha, lora.lora_dropout, seed,
                           lora.lora_fp32_adapters)
        for name, linear in targets(chunk, lora.lora_target_modules):
            gated = name.endswith("linear_fc1") and chunk.config.gated_linear_unit
            parts = row_parts(name, chunk.config, linear.weight.shape[0])
            attach(linear, LoRA(linear, _kind(linear), lora.lora_r, lora.lora_alpha, lora.lora_dropout, name,
                                seed, gated=gated, parts=parts, fp32=lora.lora_fp32_adapters))
    return chunks


def adapters(chunks) -> list[tuple[str, torch.nn.Module, LoRA]]:
    """(global name, base linear, adapter) of every adapter in these chunks."""
    return [(name, linear, linear.lora) for chunk in chunks for name, linear in targets(chunk, NAMES)
            if hasattr(linear, "lora")]


def merge(chunks) -> None:
    """Fold each adapter into its base weight shard (``W += scale * B @ A``) and zero B: same outputs, one GEMM."""
    with torch.no_grad():
        for _, linear, lora in adapters(chunks):
            linear.weight.add_(lora.delta().to(linear.weight.dtype))
            lora.lora_b.zero_()
        for _, experts in (pair for chunk in chunks for pair in grouped_targets(chunk)):
            if not hasattr(experts, "lora"):
                continue
            e, hidden = experts.num_local_experts, experts.config.hidden_size
            for name, weight in (("linear_fc1", experts.weight1), ("linear_fc2", experts.weight2)):
                if hasattr(experts.lora, name):  # GroupedMLP keeps W^T per expert: [hidden, out] / [ffn, hidden]
                    shaped = weight.view(e, hidden, -1) if name == "linear_fc1" else weight.view(e, -1, hidden)
                    shaped.add_(experts.lora.delta(name).transpose(1, 2).to(weight.dtype))
                    getattr(experts.lora, name).lora_b.zero_()
