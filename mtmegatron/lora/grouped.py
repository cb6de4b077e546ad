"""Adapters over megatron-core's grouped-GEMM experts (``GroupedMLP``, ``--moe-grouped-gemm`` on local layers): one
adapter pair per local expert on fc1 and on fc2, batched as the layer batches its weights (one grouped matmul
over all local experts per factor, ``gg.ops.gmm``, served by mtmegatron.ops.grouped_mm).

Expert e's adapters are exactly those a SequentialMLP expert gets (adapter.py), stacked over the local experts:
fc1 A [E, P r, hidden] (P = 2 for SwiGLU: one block for gate, one for up), B [E, 2 ffn, r] in the weight's
[gate; up] row order; fc2 A [E, r, ffn], B [E, hidden, r]. Each A is drawn from the same generator as the
sequential expert's (seed + ``layers.<l>.mlp.experts.local_experts.<global e>.linear_fc*``), and the checkpoint
keys, global shapes and expert axis are the sequential ones (``<prefix>experts.linear_fc1.lora.lora_a`` ...), so
runs and checkpoints carry over between sequential and grouped experts and across EP sizes, as the base weights do.
The layer's forward is replaced by ``forward`` (megatron-core 0.16's, plus the adapter paths).
May assume: expert TP 1 (config/lora_flags.py), no ``moe_act`` recompute and no probabilities applied on the
input (refused in ``attach``); the ``grouped_gemm_ops`` patch active (it is wherever GroupedMLP is built here).
"""

from __future__ import annotations

import math
import types

import torch
from megatron.core.dist_checkpointing import ShardedTensor
from megatron.core.transformer.moe import grouped_gemm_util as gg

from mtmegatron.lora.adapter import KeepsFp32, fused_delta, init_generator
from mtmegatron.utils.errors import ConfigError


class _Pair(torch.nn.Module):
    """The stacked A [E, P r, in] and B [E, out, r] of one of the layer's two linears."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, parts: torch.Tensor, allreduce: bool):
        super().__init__()
        self.lora_a, self.lora_b = torch.nn.Parameter(a), torch.nn.Parameter(b)
        for param in (self.lora_a, self.lora_b):
            param.allreduce = allreduce  # under EP: reduced over expert-DP, as GroupedMLP's weights
        self.register_buffer("parts", parts.to(a.device), persistent=False)
        self.n_parts = int(parts.max()) + 1

    def forward(self, x, tokens_per_expert, r: int) -> torch.Tensor:
        h = gg.ops.gmm(x, self.lora_a, tokens_per_expert, trans_b=True)  # [T, P r]
        if self.n_parts == 1:
            return gg.ops.gmm(h, self.lora_b, tokens_per_expert, trans_b=True)
        masks = [(self.parts == p).to(h.dtype) for p in range(self.n_parts)]
        return sum(gg.ops.gmm(h[:, p * r:(p + 1) * r].contiguous(), self.lora_b, tokens_per_expert, trans_b=True)
                   * masks[p] for p in range(self.n_parts))


class GroupedLoRA(KeepsFp32):
    """The adapters of one GroupedMLP: ``linear_fc1`` / ``linear_fc2`` (_Pair) for the targets asked for; ``fp32``
    (``--lora-fp32-adapters``): A and B in fp32 over a half-precision base, their input cast to fp32 at the grouped
    matmul and their output to the base output's dtype, as adapter.py's LoRA."""

    def __init__(self, experts, names: list[str], layer: int, r: int, alpha: float, dropout: float, seed: int,
                 fp32: bool = False):
        super().__init__()
        self.fp32 = fp32
        from mtmegatron.lora.adapter import row_parts

        config, e_local = experts.config, experts.num_local_experts
        self.r, self.scale = r, alpha / r
        self.dropout = torch.nn.Dropout(dropout) if dropout else torch.nn.Identity()
        first = experts.ep_group.rank() * e_local
        hidden, ffn = config.hidden_size, config.moe_ffn_hidden_size
        weight = experts.weight1
        dtype = torch.float32 if fp32 else weight.dtype
        shapes = {"linear_fc1": (hidden, ffn * (2 if config.gated_linear_unit else 1)), "linear_fc2": (ffn, hidden)}
        for name in ("linear_fc1", "linear_fc2"):
            if name not in names:
                continue
            fan_in, out = shapes[name]
            parts = row_parts(name, config, out)
            n_parts = int(parts.max()) + 1
            a = torch.empty(e_local, n_parts * r, fan_in)
            for e in range(e_local):  # the sequential expert's draw (adapter.py)
                bound = 1.0 / math.sqrt(fan_in)
                a[e].uniform_(-bound, bound, generator=init_generator(
                    seed, f"layers.{layer}.mlp.experts.local_experts.{first + e}.{name}"))
            b = torch.zeros(e_local, out, r)
            pair = _Pair(a.to(device=weight.device, dtype=dtype).contiguous(),
                         b.to(device=weight.device, dtype=dtype), parts, getattr(weight, "allreduce", True))
            setattr(self, name, pair)

    def path(self, name: str, x: torch.Tensor, tokens_per_expert) -> torch.Tensor | None:
        pair = getattr(self, name, None)
        if pair is None:
            return None
        return pair(self.dropout(x.to(pair.lora_a.dtype)), tokens_per_expert, self.r) * self.scale

    def delta(self, name: str) -> torch.Tensor:
        """``scale * B @ A`` per local expert ([E, out, in]): what merging adds to expert e's weight."""
        pair = getattr(self, name)
        return fused_delta(pair.lora_a, pair.lora_b, pair.parts, self.scale)


def forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs):
    """megatron-core 0.16's GroupedMLP.forward (no recompute, probabilities on the output) with the adapter
    paths added to fc1's and fc2's outputs."""
    x, lora = permuted_local_hidden_states, self.lora
    if x.nelement() != 0:
        w1 = self.weight1.view(self.num_local_experts, self.config.hidden_size, -1)
        w2 = self.weight2.view(self.num_local_experts, -1, self.config.hidden_size)
        fc1 = gg.ops.gmm(x, w1, tokens_per_expert, trans_b=False)
        extra = lora.path("linear_fc1", x, tokens_per_expert)
        fc1 = fc1 if extra is None else fc1 + extra.to(fc1.dtype)
        inter = self.activation_func_with_probs(fc1, permuted_probs.unsqueeze(-1))
        out = gg.ops.gmm(inter, w2, tokens_per_expert, trans_b=False)
        extra = lora.path("linear_fc2", inter, tokens_per_expert)
        return (out if extra is None else out + extra.to(out.dtype)), None
    # no token for the local experts: every parameter still gets a (zero) gradient, as megatron-core's branch
    h = self.activation_func_with_probs(torch.matmul(x, self.weight1.view(self.config.hidden_size, -1)),
                                        permuted_probs.unsqueeze(-1))
    out = torch.matmul(h, self.weight2.view(-1, self.config.hidden_size))
    return out + sum(p.sum() for p in lora.parameters()) * 0, None


def _sharded_state_dict(experts, base_method):
    def sharded_state_dict(prefix="", sharded_offsets=(), metadata=None):
        sd = {k: v for k, v in base_method(prefix, sharded_offsets, metadata).items() if ".lora." not in k}
        ep_size, ep_rank = experts.ep_group.size(), experts.ep_group.rank()
        replica_id = (0, 0, experts.dp_group.rank())
        for name in ("linear_fc1", "linear_fc2"):
            pair = getattr(experts.lora, name, None)
            if pair is None:
                continue
            for field in ("lora_a", "lora_b"):
                key = f"{prefix}experts.{name}.lora.{field}"  # SequentialMLP's key (its expert axis prepended)
                sd[key] = ShardedTensor.from_rank_offsets(
                    key, getattr(pair, field), *sharded_offsets, (len(sharded_offsets), ep_rank, ep_size),
                    replica_id=replica_id, prepend_axis_num=len(sharded_offsets))
        return sd
    return sharded_state_dict


def attach(experts, names: list[str], layer: int, r: int, alpha: float, dropout: float, seed: int,
           fp32: bool = False) -> None:
    """Give the GroupedMLP ``experts`` of (0-based global) decoder layer ``layer`` adapters on ``names`` (fp32 ones
    with ``fp32``)."""
    if experts.activation_recompute or experts.config.moe_apply_probs_on_input:
        raise ConfigError("--lora-r with --moe-grouped-gemm: 'moe_act' recompute and --moe-apply-probs-on-input "
                          "take no expert adapters yet")
    if experts.tp_group.size() > 1:
        raise ConfigError("--lora-r: expert adapters need expert tensor parallelism 1 "
                          "(--expert-tensor-parallel-size 1)")
    experts.lora = GroupedLoRA(experts, names, layer, r, alpha, dropout, seed, fp32)
    experts.forward = types.MethodType(forward, experts)
    experts.sharded_state_dict = _sharded_state_dict(experts, experts.sharded_state_dict)
