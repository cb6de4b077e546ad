"""``--apply-layernorm-1p`` without TransformerEngine: LayerNorm / RMSNorm whose scale is stored as ``gamma - 1``.

Megatron-LM's flag sets ``layernorm_zero_centered_gamma``: the weight starts at zero and the norm multiplies by
``1 + weight`` (so weight decay pulls the scale towards 1, not 0). TransformerEngine's norms do this natively;
megatron-core's torch norms refuse it. This is the same computation for the local and mtmegatron layer specs.
May assume: built by megatron-core's ``build_module`` with the norm keyword arguments of its norm specs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ZeroCenteredNorm(torch.nn.Module):
    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__()
        self.rms = config.normalization == "RMSNorm"
        self.shape, self.eps = (hidden_size,), eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        self.bias = None if self.rms else torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        for param in self.parameters():  # with SP, megatron all-reduces these gradients over TP
            setattr(param, "sequence_parallel", config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1 + self.weight
        if self.rms:
            return F.rms_norm(x, self.shape, scale, self.eps)
        return F.layer_norm(x, self.shape, scale, self.bias, self.eps)
