"""One low-rank adapter over one megatron-core parallel linear: ``y = base(x) + (alpha / r) * B(A(dropout(x)))``.

A fused linear (``linear_qkv``: q/k/v; SwiGLU's ``linear_fc1``: gate/up) has one adapter per part, as HF peft
has one per HF module: part p's A_p (r x in) is rows [p r, (p+1) r) of A (P r x in), and B (out x r) keeps the
base weight's row order (q/k/v rows per query group, [gate; up]), each row fed only by its own part's A
(``row_parts``): the output rows of part p are ``B[rows of p] @ A_p x``. So a peft adapter imports exactly and
B shards, reshards and merges as the base weight does.

The adapter is a child module ``lora`` of the base linear (so the base's own parameter names, and so every
checkpoint of the base, stay as they are) and runs as a forward hook that adds its path to the base's output.
TP layout, as Megatron-Bridge's ParallelLinearAdapter keeps the low-rank path beside the base:
- column-parallel base (linear_qkv, linear_fc1): A whole (r x in), B sharded on the output like the base weight.
  The input is the base's (under sequence parallelism gathered from the sequence shards, the gradient split back,
  as the base's all-gather does); the r-wide hidden is all-reduced in the backward (so A's gradient is the whole
  sum on every TP rank), never in the forward.
- row-parallel base (linear_proj, linear_fc2): A sharded on the input like the base weight, B whole (out x r).
  The r-wide partial product is all-reduced in the forward (the base reduces its output there too), and under
  sequence parallelism the output is cut to this rank's sequence shard, as the base's reduce-scatter leaves it.
A is initialised as HF peft does (kaiming-uniform, a=sqrt(5)) from a generator of its own, seeded by the run's
seed and the linear's global name, over the whole matrix before it is cut: every layout starts from the same
adapters. B starts at zero, so a wrapped model computes what its base does. Dropout (``--lora-dropout``) acts on
the adapter input only: a replicated input draws from the default generator (alike on every TP rank, as
megatron-core's hidden dropout), a TP-sharded one from the model-parallel RNG tracker. ``fp32``
(``--lora-fp32-adapters``): A and B are fp32 whatever the base's dtype, kept so when Float16Module casts the model
to bf16/fp16 (a dtype change of theirs is ignored, a device move is not), the adapter's input is cast to fp32 and
its output to the base output's dtype.
An expert's linear (SequentialMLP's ``local_experts.<e>``, ``is_expert``) is served the same way at expert TP 1
(config/lora_flags.py refuses more): no sequence-parallel gather (the token dispatcher feeds it), its adapters
reduced over the expert-data-parallel group as its weight (``allreduce``). Grouped-GEMM experts: grouped.py.
May assume: megatron-core 0.16's local ColumnParallelLinear / RowParallelLinear (TE layers: see wrap.py);
parallel state initialised.
"""

from __future__ import annotations

import math
import zlib

import torch
from megatron.core import tensor_parallel
from megatron.core.tensor_parallel import mappings
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

A_KEY, B_KEY = "lora.lora_a", "lora.lora_b"


def row_parts(name: str, config, rows: int) -> torch.Tensor:
    """The part (0 .. P-1) of each of ``rows`` rows of the fused weight ``name`` adapts (a TP shard or the
    whole: the pattern repeats per query group / is two halves), as a long tensor; all zeros for unfused ones."""
    if name.endswith("linear_qkv"):
        heads, groups, dim = config.num_attention_heads, config.num_query_groups, config.kv_channels
        group = [0] * (heads // groups * dim) + [1] * dim + [2] * dim
        return torch.tensor(group * (rows // len(group)))
    if name.endswith("linear_fc1") and config.gated_linear_unit:
        return torch.arange(rows) // (rows // 2)
    return torch.zeros(rows, dtype=torch.long)


def fused_delta(a: torch.Tensor, b: torch.Tensor, parts: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * B @ A`` with each row of B taking its own part's rows of A (``parts``: row_parts); leading
    dimensions (experts: A [E, P r, in], B [E, out, r]) are batched."""
    r = b.shape[-1]
    delta = torch.zeros(*b.shape[:-1], a.shape[-1], dtype=a.dtype, device=a.device)
    for p in range(a.shape[-2] // r):
        rows = parts.to(b.device) == p
        delta[..., rows, :] = b[..., rows, :] @ a[..., p * r:(p + 1) * r, :]
    return delta * scale


def init_generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


class KeepsFp32(torch.nn.Module):
    """A module whose parameters stay fp32 when ``self.fp32``: a change of dtype (Float16Module's ``bfloat16()``)
    is ignored, a device move is not. Adapters (LoRA here, grouped.GroupedLoRA) under ``--lora-fp32-adapters``."""

    fp32 = False

    def _apply(self, fn, recurse=True):
        if not self.fp32:
            return super()._apply(fn, recurse)

        def keep_dtype(t):
            out = fn(t)
            return t.to(out.device) if t.is_floating_point() and out.dtype != t.dtype else out
        return super()._apply(keep_dtype, recurse)


class LoRA(KeepsFp32):
    """The adapter of one base linear. ``kind`` is "column" or "row"; ``gated`` marks a SwiGLU linear_fc1 (its
    B rows are [gate; up] per TP rank, resharded as megatron-core reshards the base weight). ``parts``: the
    part of each of this rank's B rows (row_parts); its largest value + 1 is the number of A blocks."""

    def __init__(self, base: torch.nn.Module, kind: str, r: int, alpha: float, dropout: float, name: str,
                 seed: int, gated: bool = False, parts: torch.Tensor | None = None, fp32: bool = False):
        super().__init__()
        self.fp32 = fp32
        self.kind, self.scale, self.gated = kind, alpha / r, gated
        expert = getattr(base, "is_expert", False)  # the dispatcher moves an expert's tokens (expert TP 1: config)
        self.sequence_parallel, self.tp_group = base.sequence_parallel and not expert, base.tp_group
        self.dropout = torch.nn.Dropout(dropout) if dropout else torch.nn.Identity()
        tp, rank = base.tp_group.size(), base.tp_group.rank()  # (the planner builds over stand-in groups)
        weight = base.weight
        parts = torch.zeros(weight.shape[0], dtype=torch.long) if parts is None or kind == "row" else parts
        self.n_parts, self.r = int(parts.max()) + 1, r
        self.register_buffer("parts", parts.to(weight.device), persistent=False)
        masks = torch.stack([parts == p for p in range(self.n_parts)]).to(device=weight.device, dtype=weight.dtype)
        self.register_buffer("masks", masks, persistent=False)  # (P, rows): 1 where a row belongs to part p
        a = torch.empty(self.n_parts * r, base.input_size)  # the whole A, on the host, from the linear's own generator
        bound = 1.0 / math.sqrt(base.input_size)  # kaiming_uniform_(a=sqrt(5)), as peft's reset_lora_parameters
        a.uniform_(-bound, bound, generator=init_generator(seed, name))
        if kind == "row":
            a = a.chunk(tp, dim=1)[rank]
            b = torch.zeros(base.output_size, r)
        else:
            b = torch.zeros(weight.shape[0], r)
        dtype = torch.float32 if fp32 else weight.dtype
        self.lora_a = torch.nn.Parameter(a.to(device=weight.device, dtype=dtype).contiguous())
        self.lora_b = torch.nn.Parameter(b.to(device=weight.device, dtype=dtype))
        set_tensor_model_parallel_attributes(self.lora_a, kind == "row", 1, 1)
        set_tensor_model_parallel_attributes(self.lora_b, kind == "column", 0, 1)
        for param in (self.lora_a, self.lora_b):  # an expert's (under EP): reduced over expert-DP, as its weight
            param.allreduce = getattr(weight, "allreduce", True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.lora_a.dtype)  # a no-op unless fp32 adapters see a half-precision input
        if self.kind == "column":
            if self.sequence_parallel:
                x = mappings.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False,
                                                                  group=self.tp_group)
            h = mappings.copy_to_tensor_model_parallel_region(self.dropout(x) @ self.lora_a.t(), group=self.tp_group)
            if self.n_parts == 1:
                return (h @ self.lora_b.t()) * self.scale
            r = self.r
            y = sum((h[..., p * r:(p + 1) * r] @ self.lora_b.t()) * self.masks[p] for p in range(self.n_parts))
            return y * self.scale
        if self.training and isinstance(self.dropout, torch.nn.Dropout):  # a TP-sharded input: per-rank masks
            with tensor_parallel.get_cuda_rng_tracker().fork():  # (megatron-core's rule for sharded activations)
                x = self.dropout(x)
        h = mappings.reduce_from_tensor_model_parallel_region(x @ self.lora_a.t(), group=self.tp_group)
        y = (h @ self.lora_b.t()) * self.scale
        return mappings.scatter_to_sequence_parallel_region(y, group=self.tp_group) if self.sequence_parallel else y

    def delta(self) -> torch.Tensor:
        """This rank's shard of ``scale * B @ A``: what merging adds to the base weight's shard."""
        return fused_delta(self.lora_a, self.lora_b, self.parts, self.scale)

    def sharded_state_dict(self, prefix: str, sharded_offsets, metadata) -> dict:
        axis = {B_KEY: 0} if self.kind == "column" else {A_KEY: 1}
        params = {A_KEY: self.lora_a, B_KEY: self.lora_b}
        sd = make_sharded_tensors_for_checkpoint(params, prefix, axis, sharded_offsets, tp_group=self.tp_group,
                                                 dp_cp_group=metadata["dp_cp_group"])
        if self.gated:
            sd[prefix + B_KEY] = apply_swiglu_sharded_factory(sd[prefix + B_KEY], sharded_offsets)
        return sd


def _add_adapter(module, inputs, output):
    out, bias = output
    return out + module.lora(inputs[0]).to(out.dtype), bias


def _sharded_state_dict(module, base_method):
    def sharded_state_dict(prefix="", sharded_offsets=(), metadata=None):
        sd = {k: v for k, v in base_method(prefix, sharded_offsets, metadata).items()
              if not k.startswith(prefix + "lora.")}
        sd.update(module.lora.sharded_state_dict(prefix, sharded_offsets, metadata))
        return sd
    return sharded_state_dict


def attach(base: torch.nn.Module, adapter: LoRA) -> None:
    """Make ``adapter`` the ``lora`` child of ``base``, run it beside the base's forward, and checkpoint its
    weights with their TP axes (the base's own ``sharded_state_dict`` would call them replicated)."""
    base.lora = adapter
    base.register_forward_hook(_add_adapter)
    base.sharded_state_dict = _sharded_state_dict(base, base.sharded_state_dict)
