"""``--log-throughput``: model FLOPs per iteration by Megatron-LM's formula, TFLOP/s per device, and MFU.

``num_floating_point_operations(shape, batch_size)`` (``shape``: section.py's ``Shape``) follows Megatron-LM
0.16.1's function of the same name (megatron/training/training.py) for the models this package builds: dense
GPT (MHA or GQA, SwiGLU or plain MLP), MoE (top-k routed experts, shared experts, a dense/MoE layer pattern), MLA (with or without a query
LoRA) and MTP layers. Like Megatron-LM it counts the matrix multiplies only (x3 for forward + two backward
GEMMs, x2 per multiply-add), halves the causal attention scores, and counts the logits over the padded
vocabulary. Megatron-LM's hybrid (Mamba) and linear-attention branches are not built here.

Throughput is Megatron-LM's: ``flops(global batch) / (seconds per iteration * 1e12 * world size)``. MFU is that
over the device's dense bf16 peak where ``PEAK_BF16_TFLOPS`` knows the device (matched on its name) or
``MTMEGATRON_PEAK_BF16_TFLOPS`` gives it.
May assume: the shape's flags are validated (padded_vocab_size set; moe_layer_freq parsed to an int or a 0/1 list).
"""

from __future__ import annotations

import os

from mtmegatron.training.observability.section import Shape

# Dense (no sparsity) BF16 tensor-core peak per device in TFLOP/s, matched on the device name in this order
# (the more specific names first). Sources:
#   H100 SXM 989.4, H100 PCIe 756, H100 NVL 835: NVIDIA H100 Tensor Core GPU datasheet (the sheet's 1979 /
#     1513 / 1671 are "with sparsity"; dense is half).
#   H200 SXM 989, H200 NVL 835: NVIDIA H200 Tensor Core GPU datasheet (1979 / 1671 with sparsity).
#   A100 312 (SXM and PCIe): NVIDIA A100 Tensor Core GPU datasheet (624 with sparsity).
#   MTT S4000 100: Moore Threads' S4000 launch announcement, Dec 2023 (25 FP32 / 50 TF32 / 100 FP16-BF16 TFLOPS,
#     200 INT8 TOPS).
#   MTT S5000: its launch material gives 1000 TFLOPS per card at FP8 and no BF16 figure we could cite: not in the
#     table (MFU n/a), set MTMEGATRON_PEAK_BF16_TFLOPS to the peak you know.
PEAK_BF16_TFLOPS = (
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.4),
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("A100", 312.0),
    ("S4000", 100.0),
)


PEAK_ENV = "MTMEGATRON_PEAK_BF16_TFLOPS"


def peak_bf16_tflops(device_name: str) -> float | None:
    """The dense BF16 peak of a device: ``MTMEGATRON_PEAK_BF16_TFLOPS`` when set, else from its name in the
    table; None when neither knows it."""
    if os.environ.get(PEAK_ENV):
        return float(os.environ[PEAK_ENV])
    for pattern, peak in PEAK_BF16_TFLOPS:
        if pattern.lower() in device_name.lower():
            return peak
    return None


def _moe_layer_pattern(shape: Shape) -> list[int]:
    freq = shape.moe_layer_freq
    if isinstance(freq, int):
        return [1 if i % freq == 0 else 0 for i in range(shape.num_layers)]
    if isinstance(freq, list):
        return list(freq)
    raise ValueError(f"--moe-layer-freq {freq!r}: expected an int or a 0/1 list")


def _self_attention_term(shape: Shape) -> float:
    """FLOPs per token of one attention block, forward + backward (x3) and multiply-add (x2) included."""
    h, heads = shape.hidden_size, shape.num_attention_heads
    s = shape.seq_length
    if shape.multi_latent_attention:
        qk, rope, v = shape.qk_head_dim, shape.qk_pos_emb_head_dim, shape.v_head_dim
        if shape.q_lora_rank is None:  # direct query projection
            q_term = h * heads * (qk + rope)
        else:  # down-projection, norm (the +1), up-projection
            q_term = shape.q_lora_rank * (h + heads * (qk + rope) + 1)
        terms = (q_term
                 + shape.kv_lora_rank * (h + heads * (qk + v) + 1)  # kv down, norm, up
                 + h * rope  # the shared RoPE key
                 + heads * v * h  # output projection
                 + s * heads * (qk + rope) / 2  # scores, causal half
                 + s * heads * v / 2)  # scores x values, causal half
        return 3 * 2 * terms
    kv_channels = shape.kv_channels or h // heads
    groups = shape.num_query_groups if shape.group_query_attention else heads
    query = kv_channels * heads
    key = value = kv_channels * groups
    gate = query if shape.attention_output_gate else 0
    terms = (h * (query + key + value + gate)  # qkv projection
             + query * s / 2 * 2  # QK^T and (QK^T)V, causal half
             + query * h)  # output projection
    return 3 * 2 * terms


def num_floating_point_operations(shape: Shape, batch_size: int) -> float:
    """Model FLOPs of one iteration over ``batch_size`` sequences (Megatron-LM's transformer formula)."""
    h, s = shape.hidden_size, shape.seq_length
    if shape.num_experts is None:
        dense_layers, moe_layers, routed_to, last_is_moe = shape.num_layers, 0, 0, 0
    else:
        pattern = _moe_layer_pattern(shape)
        if len(pattern) != shape.num_layers:
            raise ValueError(f"--moe-layer-freq lists {len(pattern)} layers, not --num-layers {shape.num_layers}")
        moe_layers = sum(pattern)
        dense_layers = shape.num_layers - moe_layers
        routed_to, last_is_moe = shape.moe_router_topk, pattern[-1]
    mtp_layers = shape.mtp_num_layers or 0
    moe_layers += last_is_moe * mtp_layers  # an MTP layer has the MLP kind of the last decoder layer
    dense_layers += (1 - last_is_moe) * mtp_layers
    layers = shape.num_layers + mtp_layers
    moe_ffn = shape.moe_ffn_hidden_size if shape.moe_ffn_hidden_size is not None else shape.ffn_hidden_size
    shared_ffn = shape.moe_shared_expert_intermediate_size or 0
    ffn_gemms = 3 if shape.swiglu else 2  # SwiGLU: gate and up (h -> 2 ffn) then down; else up and down
    mlp = 3 * 2 * h * (shape.ffn_hidden_size * ffn_gemms * dense_layers
                       + moe_ffn * routed_to * ffn_gemms * moe_layers
                       + shared_ffn * ffn_gemms * moe_layers)
    mtp = 3 * 2 * mtp_layers * (3 * h + 2 * h * h)  # MTP: its norms and the 2h -> h projection
    logits = 3 * 2 * h * shape.padded_vocab_size * (mtp_layers + 1)
    return batch_size * s * (mlp + _self_attention_term(shape) * layers + mtp + logits)


def tflops_per_device(flops_per_iteration: float, seconds_per_iteration: float, world_size: int) -> float:
    """Megatron-LM's "throughput per GPU (TFLOP/s/GPU)"."""
    return flops_per_iteration / (seconds_per_iteration * 1e12 * world_size)
