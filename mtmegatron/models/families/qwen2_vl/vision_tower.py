"""The native-resolution vision encoder (Qwen2-VL / Qwen2.5-VL): patches of any number of images of any size in
one packed sequence, through megatron-core's ``TransformerBlock``, then the ``m x m`` patch merger.

- Patch embedding: HF's Conv3d (kernel = stride = temporal patch x patch x patch, no bias) over one flattened
  patch is a matrix product with the flattened kernel, so it is a bias-free ``Linear(C*T*P*P -> hidden)``
  (the HF map reshapes the kernel).
- Attention: bidirectional, each image's temporal slab attending only to itself: a THD ``PackedSeqParams``
  (``cu_seqlens`` of models/families/qwen2_vl/vision_packing.py) into the layers' core attention, which is mtmegatron's SDPA
  attention (it takes packed sequences; megatron-core's local ``DotProductAttention`` does not).
- Position: the 2-D rotary angles of vision_packing.py as the layers' ``rotary_pos_emb`` (megatron-core applies
  them per packed token: the angles have one row per token).
- Windowed attention (Qwen2.5-VL, ``window`` merge blocks a side): the merge blocks are regrouped window by
  window before the layers (angles too), layers not in ``full_attention_layers`` attend within their window,
  the others over the whole slab; the merged outputs go back to the packed order.
- Merger: the norm of each patch, each ``m x m`` block's patches concatenated, then megatron-core's
  ``MultimodalProjector`` MLP (Linear, GELU, Linear with biases) into the language model's hidden size.
May assume: the encoder-side config (no pipeline/context parallelism), a layer spec whose core attention takes THD
packed sequences, and ``pixel_values`` rows in vision_packing.py's order.
"""

from __future__ import annotations

import torch
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_block import TransformerBlock

from mtmegatron.models.families.qwen2_vl.vision_packing import cu_seqlens, vision_rotary_freqs, window_order


def packed(cu: torch.Tensor) -> PackedSeqParams:
    longest = int((cu[1:] - cu[:-1]).max())
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                           max_seqlen_kv=longest)


class PackedVisionEncoder(MegatronModule):
    """``forward(pixel_values [n, C*T*P*P], grid_thw [images, 3]) -> [n / m**2, language hidden]``."""

    def __init__(self, config: TransformerConfig, layer_spec: ModuleSpec, norm: type, merger_config: TransformerConfig,
                 merger_spec, patch_input_size: int, merge: int, window: int | None = None,
                 full_attention_layers: tuple = (), pg_collection=None):
        super().__init__(config=config)
        self.merge, self.window, self.full_attention_layers = merge, window, frozenset(full_attention_layers)
        self.head_dim = config.kv_channels
        self.patch_embed = torch.nn.Linear(patch_input_size, config.hidden_size, bias=False)
        if config.perform_initialization:  # megatron's init, as every other weight (not torch's kaiming default)
            with torch.no_grad():
                config.init_method(self.patch_embed.weight)
        self.decoder = TransformerBlock(config=config, spec=layer_spec, post_layer_norm=False, pre_process=True,
                                        post_process=False, pg_collection=pg_collection)
        self.merger_norm = build_module(norm, config=config, hidden_size=config.hidden_size,
                                        eps=config.layernorm_epsilon)
        self.merger = MultimodalProjector(merger_config, merger_spec, "mlp", config.hidden_size * merge * merge)

    def set_input_tensor(self, tensor) -> None:  # the encoder always starts from pixels
        pass

    def _regroup(self, x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """Rows of ``x`` (one per patch) with the merge blocks put in ``order``."""
        unit = self.merge * self.merge
        return x.reshape(-1, unit, *x.shape[1:])[order].reshape(x.shape)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype))
        freqs = vision_rotary_freqs(grid_thw, self.merge, self.head_dim)
        whole = packed(cu_seqlens(grid_thw).to(x.device))
        x = x.unsqueeze(1)  # [n, 1, hidden]: one packed sequence (THD)
        if self.window is None:
            x = self.decoder(x, attention_mask=None, rotary_pos_emb=freqs, packed_seq_params=whole)
        else:
            order, window_cu = window_order(grid_thw, self.merge, self.window)
            x, freqs = self._regroup(x, order), self._regroup(freqs, order)
            windows = packed(window_cu.to(x.device))
            for i, layer in enumerate(self.decoder.layers):
                params = whole if i in self.full_attention_layers else windows
                x, _ = layer(x, attention_mask=None, rotary_pos_emb=freqs, packed_seq_params=params)
        x = self.merger_norm(x.squeeze(1))
        merged = self.merger(x.reshape(-1, x.shape[-1] * self.merge * self.merge))
        if self.window is not None:
            merged = merged[torch.argsort(order)]
        return merged
