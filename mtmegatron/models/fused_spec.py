"""The modules of `--transformer-impl mtmegatron`: mtmegatron's fused ops inside megatron-core's own modules,
plus the fused loss. `models/layer_spec.build_layer_spec` puts them into the layer spec:
- norms: `FusedRMSNorm` (mtmegatron::rms_norm; LayerNorm configs keep megatron's WrappedTorchNorm);
- dense MLP: `FusedMLP` (mtmegatron::swiglu on the [gate; up] fc1 output when the config is plain SwiGLU);
- core attention (`--attention-backend local`): `FusedDotProductAttention` (mtmegatron scaled_masked /
  upper-triang softmax).
Everything else (linears, MLA, MoE layer and its experts, bias-dropout-add) stays megatron-core's.
RoPE and the MoE router/permute are reached through module globals of megatron-core (rope_utils /
moe_utils), i.e. patches, not a spec: see docs/kernels.md.

`install_fused_loss(model)` makes a GPTModel compute its LM loss with mtmegatron's vocab-parallel cross-entropy.
May assume: megatron-core 0.16.x is importable; device agnostic (no device API calls here).
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.torch_norm import WrappedTorchNorm

from mtmegatron import ops


class FusedRMSNorm(torch.nn.Module):
    """RMSNorm with megatron's norm constructor signature; parameter named `weight` like torch.nn.RMSNorm."""

    def __new__(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,
                normalization="RMSNorm"):
        if config.normalization != "RMSNorm":
            return WrappedTorchNorm(config, hidden_size, eps, persist_layer_norm, zero_centered_gamma, normalization)
        return super().__new__(cls)

    def __init__(self, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,
                 normalization="RMSNorm"):
        super().__init__()
        self.eps = eps
        self.zero_centered_gamma = config.layernorm_zero_centered_gamma
        init = 0.0 if self.zero_centered_gamma else 1.0
        self.weight = torch.nn.Parameter(torch.full((hidden_size,), init, dtype=config.params_dtype))
        setattr(self.weight, "sequence_parallel", config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight + 1 if self.zero_centered_gamma else self.weight
        return ops.rms_norm(x, weight, self.eps)


class FusedMLP(MLP):
    """megatron MLP whose plain SwiGLU activation runs mtmegatron::swiglu; other configs use MLP.forward."""

    def _plain_swiglu(self, per_token_scale) -> bool:
        c = self.config
        return (c.gated_linear_unit and self.activation_func is F.silu and per_token_scale is None
                and not c.use_te_activation_func and c.activation_func_clamp_value is None
                and c.glu_linear_offset == 0.0)

    def forward(self, hidden_states, per_token_scale=None, **kwargs):
        if not self._plain_swiglu(per_token_scale):
            return super().forward(hidden_states, per_token_scale, **kwargs)
        intermediate, bias = self.linear_fc1(hidden_states)
        if bias is not None:
            intermediate = intermediate + bias
        return self.linear_fc2(ops.swiglu(intermediate))


class MtmScaleMaskSoftmax(FusedScaleMaskSoftmax):
    """FusedScaleMaskSoftmax whose scale+mask+softmax runs mtmegatron's softmax ops (fp32 math, input dtype
    out: megatron's softmax_in_fp32 semantics). Sliding windows and softmax offsets use megatron's path."""

    def forward(self, input, mask, softmax_offset=None):
        if softmax_offset is not None or self.window_size is not None:
            return super().forward(input, mask, softmax_offset)
        b, np_, sq, sk = input.shape
        scale = self.scale if self.scale is not None else 1.0
        if self.attn_mask_type == AttnMaskType.causal and mask is None and sq > 1:
            if sq != sk:
                return super().forward(input, mask, softmax_offset)
            out = ops.scaled_upper_triang_masked_softmax(input.reshape(b * np_, sq, sk), scale)
            return out.view(b, np_, sq, sk)
        if mask is not None and not (mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2:] == (sq, sk)
                                     and mask.shape[0] in (1, b) and mask.dtype == torch.bool):
            return super().forward(input, mask, softmax_offset)
        return ops.scaled_masked_softmax(input, mask, scale)


class FusedDotProductAttention(DotProductAttention):
    """megatron DotProductAttention with MtmScaleMaskSoftmax."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        old = self.scale_mask_softmax
        self.scale_mask_softmax = MtmScaleMaskSoftmax(
            old.input_in_fp16, old.input_in_bf16, old.attn_mask_type, old.scaled_masked_softmax_fusion,
            old.mask_func, old.softmax_in_fp32, old.scale, old.window_size,
        )


def _fused_language_model_loss(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """LanguageModule.compute_language_model_loss with mtmegatron's vocab-parallel cross-entropy."""
    labels = labels.transpose(0, 1).contiguous()
    tp_group = getattr(getattr(self, "pg_collection", None), "tp", None)
    loss = ops.vocab_parallel_cross_entropy(logits, labels, tp_group=tp_group)
    return loss.transpose(0, 1).contiguous()


def get_fused_cross_entropy():
    """The fused loss with megatron's `vocab_parallel_cross_entropy(logits [s,b,v/tp], target [s,b]) -> [s,b]`
    contract (tp group from megatron's parallel_state unless passed as tp_group=)."""
    return ops.vocab_parallel_cross_entropy


def install_fused_loss(model: torch.nn.Module) -> torch.nn.Module:
    """Make `model` (a GPTModel, or anything with LanguageModule.compute_language_model_loss) use the fused
    cross-entropy; per instance, megatron-core's class is untouched. Returns the model."""
    model.compute_language_model_loss = types.MethodType(_fused_language_model_loss, model)
    return model
