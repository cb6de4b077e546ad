"""``SDPADotProductAttention``: megatron-core's local ``DotProductAttention`` on ``scaled_dot_product_attention``.

A drop-in for the ``core_attention`` slot of megatron-core's attention modules (same constructor and forward
signature, plus MLA's ``k_channels``/``v_channels``), built on torch's fused SDPA kernels (flash /
memory-efficient on CPU, CUDA and, via torch_musa, MUSA) instead of materialising ``[b, h, s, s]`` scores:
- masks: causal (``attn_mask_type`` causal and no mask), or megatron's boolean ``attention_mask``
  (True = masked, ``[b|1, 1, sq|1, sk]``), which wins over the mask type as in megatron's softmax;
- GQA without repeating KV heads; q/k head dim != v head dim (MLA);
- attention dropout drawn under megatron's model-parallel RNG tracker (as the local module does);
- softmax scale: ``softmax_scale`` or 1/sqrt(k head dim) (``apply_query_key_layer_scaling`` only guards fp16
  range in megatron and does not change the result: the kernels compute the softmax in fp32);
- THD packed sequences (``packed_seq_params.qkv_format == 'thd'``, ``cu_seqlens``): attention per sequence;
- context parallelism (``config.context_parallel_size > 1``): ring (``p2p``) or ``all_gather`` attention
  over megatron's CP group on the load-balanced chunks, see ring.py / all_gather.py; THD under CP (each
  sequence split into 2*CP chunks, ``cu_seqlens_q_padded``) always takes the all-gather path of thd_cp.py;
- sliding windows (``window_size``, per layer by ``window_attn_skip_freq``) and sinks (``softmax_type``
  ``off-by-one`` / ``learnable``) on every path above, semantics in window_sink.py. The learnable sink is the
  parameter ``softmax_offset`` ``[heads of this TP partition]``, created, initialised (``config.init_method``)
  and checkpointed (sharded along TP) as megatron-core's ``DotProductAttention`` does; off-by-one is a zero
  tensor of that name. A window and an explicit mask combine (both must allow a key).
Not supported (clear error at construction): attention bias; CP with an explicit attention mask or dropout;
THD under CP without ``cu_seqlens_q_padded`` or with different query and key/value sequences.
May assume: megatron-core 0.16.x; parallel state initialised; device agnostic (no device API calls).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint
from megatron.core.utils import divide

from mtmegatron.attention.all_gather import all_gather_attention
from mtmegatron.attention.ring import ring_attention
from mtmegatron.attention.sdpa import sdpa
from mtmegatron.attention.spec import CP_COMM_TYPES
from mtmegatron.attention.thd_cp import thd_cp_attention
from mtmegatron.attention.window_sink import block_allowed, sdpa_window_sink, window_for_layer
from mtmegatron.backends.active import active_backend


def _parameter_device(config) -> torch.device:
    """Where megatron-core would create the sink: the host with ``use_cpu_initialization``, else this rank's
    device of the active backend."""
    backend = active_backend()
    if config.use_cpu_initialization or backend is None or backend.device_is_host:
        return torch.device("cpu")
    return torch.device(backend.device_type, backend.device_module().current_device())


class SDPADotProductAttention(MegatronModule):
    """Core attention ``[sq, b, np, hn] x3 -> [sq, b, np * hv]`` on torch's SDPA (see the module docstring)."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, cp_comm_type: Optional[str] = None,
                 pg_collection=None, k_channels: Optional[int] = None, v_channels: Optional[int] = None):
        super().__init__(config=config)
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.window = window_for_layer(config, layer_number)
        self.tp_group = pg_collection.tp if pg_collection is not None else \
            parallel_state.get_tensor_model_parallel_group()
        tp_size = self.tp_group.size()
        self.num_heads_per_partition = divide(config.num_attention_heads, tp_size)
        self._make_softmax_offset(config)
        self.k_channels = k_channels or config.kv_channels
        self.v_channels = v_channels or config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.k_channels)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.cp_size = config.context_parallel_size
        self.cp_comm_type = cp_comm_type or config.cp_comm_type or "p2p"
        if self.cp_size > 1:
            if self.cp_comm_type not in CP_COMM_TYPES:
                raise ValueError(f"cp_comm_type {self.cp_comm_type!r} is not supported by mtmegatron's attention "
                                 f"(choose from {', '.join(CP_COMM_TYPES)})")
            if self.dropout_p:
                raise ValueError("context parallelism with attention dropout is not supported; "
                                 "use --attention-dropout 0")
            self.cp_group = pg_collection.cp if pg_collection is not None and hasattr(pg_collection, "cp") \
                else parallel_state.get_context_parallel_group()

    def _make_softmax_offset(self, config) -> None:
        """megatron-core's ``softmax_offset``: None (vanilla), zeros (off-by-one) or a learnable parameter."""
        shape, dtype = (self.num_heads_per_partition,), config.params_dtype
        if config.softmax_type == "vanilla":
            self.softmax_offset = None
        elif config.softmax_type == "off-by-one":
            self.softmax_offset = torch.zeros(shape, device=_parameter_device(config), dtype=dtype)
        elif config.softmax_type == "learnable":
            self.register_parameter("softmax_offset", torch.nn.Parameter(
                torch.empty(shape, device=_parameter_device(config), dtype=dtype)))
            if config.perform_initialization:
                self.softmax_offset = config.init_method(self.softmax_offset)
        else:
            raise ValueError(f"softmax_type {config.softmax_type!r} is not supported (vanilla, off-by-one, "
                             "learnable)")

    def _sink(self, like: torch.Tensor):
        return None if self.softmax_offset is None else self.softmax_offset.to(like.device)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata: Optional[dict] = None):
        """megatron-core's: the learnable ``softmax_offset`` sharded along TP (axis 0); MegatronModule's otherwise."""
        if self.config.softmax_type != "learnable":
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)
        return make_sharded_tensors_for_checkpoint(self.state_dict(prefix="", keep_vars=True), prefix,
                                                   {"softmax_offset": 0}, sharded_offsets, tp_group=self.tp_group,
                                                   dp_cp_group=metadata["dp_cp_group"])

    def _dropout(self) -> float:
        return self.dropout_p if self.training else 0.0

    def _windowed_or_sink(self) -> bool:
        return self.window is not None or self.softmax_offset is not None

    def _attend(self, q, k, v, mask, causal):
        """[b, h, s, d] attention with dropout drawn from megatron's model-parallel RNG state. With a window or a
        sink, ``causal`` is the layer's mask type and ``mask`` (True = may attend) narrows it further."""
        p = self._dropout()
        if p and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                return self._attend_kernel(q, k, v, mask, causal, p)
        return self._attend_kernel(q, k, v, mask, causal, p)

    def _attend_kernel(self, q, k, v, mask, causal, p):
        if not self._windowed_or_sink():
            return sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=self.softmax_scale, dropout_p=p)
        sq, sk = q.shape[2], k.shape[2]
        allowed = block_allowed(sk - sq, sq, 0, sk, self.window, causal, q.device)  # bottom-right aligned
        if mask is not None:
            allowed = allowed & mask
        return sdpa_window_sink(q, k, v, allowed, self._sink(q), self.softmax_scale, p)

    def _packed(self, query, key, value, params: PackedSeqParams, causal: bool):
        """THD: [t, np, hn] with sequences at cu_seqlens (padded offsets when given) -> [t, np * hv]."""
        starts_q = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
        starts_kv = params.cu_seqlens_kv_padded if params.cu_seqlens_kv_padded is not None else params.cu_seqlens_kv
        lens_q = (params.cu_seqlens_q[1:] - params.cu_seqlens_q[:-1]).tolist()
        lens_kv = (params.cu_seqlens_kv[1:] - params.cu_seqlens_kv[:-1]).tolist()
        out = query.new_zeros(query.shape[0], query.shape[1], value.shape[-1])
        for start_q, start_kv, len_q, len_kv in zip(starts_q[:-1].tolist(), starts_kv[:-1].tolist(), lens_q, lens_kv):
            q = query[start_q: start_q + len_q].transpose(0, 1).unsqueeze(0)
            k = key[start_kv: start_kv + len_kv].transpose(0, 1).unsqueeze(0)
            v = value[start_kv: start_kv + len_kv].transpose(0, 1).unsqueeze(0)
            out[start_q: start_q + len_q] = self._attend(q, k, v, None, causal)[0].transpose(0, 1)
        return out.reshape(out.shape[0], -1)

    def _packed_cp(self, query, key, value, params: PackedSeqParams, causal: bool):
        """THD under CP: this rank's chunks of every sequence (see thd_cp.py) -> [t_local, np * hv]."""
        cu = params.cu_seqlens_q_padded
        if cu is None or params.cu_seqlens_kv_padded is None or not torch.equal(cu, params.cu_seqlens_kv_padded):
            raise ValueError("packed (THD) sequences under context parallelism need cu_seqlens_q_padded (each "
                             "sequence padded to a multiple of 2 x CP) equal for queries and keys")
        out = thd_cp_attention(query, key, value, cu, causal, self.softmax_scale, self.cp_group, self.window,
                               self._sink(query))
        return out.reshape(out.shape[0], -1)

    def forward(self, query, key, value, attention_mask, attn_mask_type: Optional[AttnMaskType] = None,
                attention_bias=None, packed_seq_params: Optional[PackedSeqParams] = None):
        if attention_bias is not None:
            raise ValueError("attention bias is not supported by mtmegatron's SDPA attention")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = mask_type == AttnMaskType.causal and (attention_mask is None or self._windowed_or_sink())
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            if self.cp_size > 1:
                return self._packed_cp(query, key, value, packed_seq_params, mask_type == AttnMaskType.causal)
            return self._packed(query, key, value, packed_seq_params, causal or mask_type == AttnMaskType.causal)
        sq, b = query.shape[0], query.shape[1]
        # [s, b, h, d] -> [b, h, s, d] (views; the kernels take strided inputs)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if self.cp_size > 1:
            if attention_mask is not None:
                raise ValueError("context parallelism with an explicit attention mask is not supported")
            attend = ring_attention if self.cp_comm_type == "p2p" else all_gather_attention
            out = attend(q, k, v, mask_type == AttnMaskType.causal, self.softmax_scale, self.cp_group, self.window,
                         self._sink(q))
        else:
            mask = None if attention_mask is None else ~attention_mask
            out = self._attend(q, k, v, mask, causal)
        # [b, h, s, hv] -> [s, b, h * hv]
        return out.permute(2, 0, 1, 3).reshape(sq, b, -1)
