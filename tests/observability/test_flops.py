"""Megatron-LM's FLOP formula (training/observability/throughput.py) against FLOPs counted independently here: each GEMM of
the model written out by its weight shape (2 FLOPs per multiply-add x 3 for forward + two backward GEMMs =
6 per weight element per token), plus the causal attention products; and the closed form of Narayanan et al.
(2021) for GPT-3 175B. Also the device peak table used for MFU.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mtmegatron.training.observability.throughput import (num_floating_point_operations, peak_bf16_tflops, PEAK_ENV,
                                            tflops_per_device)


def gpt_args(**overrides) -> SimpleNamespace:
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=4,
                group_query_attention=False, ffn_hidden_size=128, seq_length=32, padded_vocab_size=256,
                swiglu=False, num_experts=None, moe_layer_freq=1, moe_router_topk=2, moe_ffn_hidden_size=None,
                moe_shared_expert_intermediate_size=None, mtp_num_layers=None, multi_latent_attention=False,
                q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
                kv_channels=None, attention_output_gate=False)
    base.update(overrides)
    return SimpleNamespace(**base)


def per_token(weights: int, attention_products: float = 0.0) -> float:
    """FLOPs per token of GEMMs with ``weights`` weight elements and ``attention_products`` multiply-adds of
    the attention scores and values (forward x 3, 2 per multiply-add)."""
    return 6 * (weights + attention_products)


def test_gpt3_175b_matches_the_closed_form():
    # GPT-3 175B: 96 layers, hidden 12288, 96 heads, seq 2048, vocab 51200 (padded), MLP 4h, no GLU
    l, h, s, v, b = 96, 12288, 2048, 51200, 1536
    args = gpt_args(num_layers=l, hidden_size=h, num_attention_heads=96, num_query_groups=96,
                    ffn_hidden_size=4 * h, seq_length=s, padded_vocab_size=v)
    # Narayanan et al. 2021, eq. (3) with the causal half of the attention scores: 72 B s l h^2 (1 + s/(12h) + V/(12lh))
    expected = 72 * b * s * l * h ** 2 * (1 + s / (12 * h) + v / (12 * l * h))
    assert num_floating_point_operations(args, b) == pytest.approx(expected, rel=1e-12)


def test_dense_gqa_swiglu():
    h, heads, groups, ffn, s, v, layers, b = 64, 4, 2, 128, 32, 256, 2, 8
    head_dim = h // heads
    args = gpt_args(hidden_size=h, num_attention_heads=heads, num_query_groups=groups, group_query_attention=True,
                    ffn_hidden_size=ffn, seq_length=s, padded_vocab_size=v, num_layers=layers, swiglu=True)
    layer = per_token(
        h * heads * head_dim + 2 * h * groups * head_dim  # q, k, v projections
        + heads * head_dim * h  # output projection
        + h * 2 * ffn + ffn * h,  # gate+up, down
        attention_products=2 * heads * head_dim * s / 2)  # QK^T and PV over the causal half
    expected = b * s * (layers * layer + per_token(h * v))  # + logits
    assert num_floating_point_operations(args, b) == pytest.approx(expected, rel=1e-12)


def test_kv_channels_other_than_hidden_over_heads():
    h, heads, kv_channels, s = 64, 4, 32, 16
    args = gpt_args(hidden_size=h, num_attention_heads=heads, num_query_groups=heads, kv_channels=kv_channels,
                    seq_length=s, num_layers=1, ffn_hidden_size=128, padded_vocab_size=128)
    attention = per_token(3 * h * heads * kv_channels + heads * kv_channels * h,
                          attention_products=heads * kv_channels * s)
    expected = s * (attention + per_token(2 * h * 128) + per_token(h * 128))
    assert num_floating_point_operations(args, 1) == pytest.approx(expected, rel=1e-12)


def test_moe_with_a_dense_first_layer_topk_and_a_shared_expert():
    h, s, v, b, topk, expert_ffn, shared, dense_ffn = 64, 16, 512, 3, 2, 32, 64, 128
    args = gpt_args(hidden_size=h, num_attention_heads=4, num_query_groups=4, seq_length=s, padded_vocab_size=v,
                    num_layers=4, swiglu=True, ffn_hidden_size=dense_ffn, num_experts=8, moe_router_topk=topk,
                    moe_layer_freq=[0, 1, 1, 1], moe_ffn_hidden_size=expert_ffn,
                    moe_shared_expert_intermediate_size=shared)
    attention = per_token(4 * h * h, attention_products=h * s)  # MHA: qkv + out; causal QK^T and PV
    dense_mlp = per_token(3 * h * dense_ffn)
    moe_mlp = per_token(topk * 3 * h * expert_ffn + 3 * h * shared)  # each token through topk experts + shared
    expected = b * s * (4 * attention + dense_mlp + 3 * moe_mlp + per_token(h * v))
    assert num_floating_point_operations(args, b) == pytest.approx(expected, rel=1e-12)
    # moe_layer_freq as an int: an MoE layer every 2 layers (0 and 2); the router is not counted (as Megatron-LM)
    args.moe_layer_freq = 2
    expected = b * s * (4 * attention + 2 * dense_mlp + 2 * moe_mlp + per_token(h * v))
    assert num_floating_point_operations(args, b) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_mla_with_and_without_query_lora_and_one_mtp_layer(q_lora_rank):
    h, heads, kv_lora, qk, rope, vd, s, v, b, ffn = 64, 4, 16, 16, 8, 16, 16, 256, 2, 128
    args = gpt_args(hidden_size=h, num_attention_heads=heads, multi_latent_attention=True, q_lora_rank=q_lora_rank,
                    kv_lora_rank=kv_lora, qk_head_dim=qk, qk_pos_emb_head_dim=rope, v_head_dim=vd, seq_length=s,
                    padded_vocab_size=v, swiglu=True, ffn_hidden_size=ffn, num_layers=2, mtp_num_layers=1)
    if q_lora_rank is None:
        query = h * heads * (qk + rope)  # linear_q_proj
    else:  # linear_q_down_proj, the q norm (Megatron-LM counts its q_lora_rank elements), linear_q_up_proj
        query = h * q_lora_rank + q_lora_rank + q_lora_rank * heads * (qk + rope)
    key_value = (h * (kv_lora + rope)  # linear_kv_down_proj (latent + the shared RoPE key)
                 + kv_lora  # kv norm
                 + kv_lora * heads * (qk + vd))  # linear_kv_up_proj
    attention = per_token(query + key_value + heads * vd * h,  # + linear_proj
                          attention_products=heads * (qk + rope) * s / 2 + heads * vd * s / 2)
    mlp = per_token(3 * h * ffn)
    mtp_extra = per_token(3 * h + 2 * h * h)  # MTP: enorm, hnorm, final norm; eh_proj 2h -> h
    logits = per_token(h * v)
    expected = b * s * (3 * (attention + mlp) + mtp_extra + 2 * logits)  # 2 decoder layers + the MTP layer
    assert num_floating_point_operations(args, b) == pytest.approx(expected, rel=1e-12)


def test_throughput_is_flops_over_time_world_and_1e12():
    assert tflops_per_device(8e12, 0.5, 4) == pytest.approx(4.0)


def test_peak_table_and_override(monkeypatch):
    monkeypatch.delenv(PEAK_ENV, raising=False)
    assert peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_bf16_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_bf16_tflops("NVIDIA H200") == 989.0
    assert peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_bf16_tflops("MTT S4000") == 100.0
    assert peak_bf16_tflops("MTT S5000") is None
    assert peak_bf16_tflops("Some Future Accelerator") is None
    monkeypatch.setenv(PEAK_ENV, "500")
    assert peak_bf16_tflops("MTT S5000") == 500.0
