"""Synthetic HF checkpoints of a chosen size for the converter's benchmark and tests: a Llama-shaped
``config.json`` and random bf16 (or fp32) tensors, one safetensors shard per layer plus the index, written one
shard at a time (memory: one layer). Not a model anyone trained: only the shapes and names are real.

May assume: the ``safetensors`` package.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from mtmegatron.convert.hf_io import INDEX


def llama_shape_for(total_bytes: int, hidden: int = 1024, dtype: torch.dtype = torch.bfloat16) -> dict:
    """A Llama config (hidden ``hidden``, FFN 4x, GQA 4:1, vocab 8192) with about ``total_bytes`` of weights."""
    size = torch.empty((), dtype=dtype).element_size()
    heads, groups, ffn, vocab = hidden // 64, max(1, hidden // 256), 4 * hidden, 8192
    per_layer = (hidden * (hidden + 2 * groups * 64) + hidden * hidden + 3 * hidden * ffn + 2 * hidden) * size
    fixed = (2 * vocab * hidden + hidden) * size
    layers = max(1, round((total_bytes - fixed) / per_layer))
    return dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu", hidden_size=hidden,
                intermediate_size=ffn, num_attention_heads=heads, num_key_value_heads=groups, head_dim=64,
                num_hidden_layers=layers, vocab_size=vocab, max_position_embeddings=4096, rms_norm_eps=1e-5,
                rope_theta=500000.0, tie_word_embeddings=False,
                torch_dtype={torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype])


def write_llama(directory: str, config: dict, seed: int = 0) -> int:
    """Write ``config`` and random weights for it under ``directory``; returns the bytes of weights written."""
    os.makedirs(directory, exist_ok=True)
    dtype = getattr(torch, config["torch_dtype"])
    gen = torch.Generator().manual_seed(seed)
    hidden, ffn, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    q = config["num_attention_heads"] * config["head_dim"]

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(dtype)

    shards = [{"model.embed_tokens.weight": rand(vocab, hidden), "model.norm.weight": torch.ones(hidden, dtype=dtype),
               "lm_head.weight": rand(vocab, hidden)}]
    layers = config["num_hidden_layers"]
    weight_map, total = {}, 0
    for i in range(-1, layers):
        if i >= 0:
            p = f"model.layers.{i}."
            shards = [{p + "self_attn.q_proj.weight": rand(q, hidden), p + "self_attn.k_proj.weight": rand(kv, hidden),
                       p + "self_attn.v_proj.weight": rand(kv, hidden), p + "self_attn.o_proj.weight": rand(hidden, q),
                       p + "mlp.gate_proj.weight": rand(ffn, hidden), p + "mlp.up_proj.weight": rand(ffn, hidden),
                       p + "mlp.down_proj.weight": rand(hidden, ffn),
                       p + "input_layernorm.weight": torch.ones(hidden, dtype=dtype),
                       p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=dtype)}]
        file = f"model-{i + 2:05d}-of-{layers + 1:05d}.safetensors"
        save_file(shards[0], os.path.join(directory, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shards[0]})
        total += sum(t.numel() * t.element_size() for t in shards[0].values())
    with open(os.path.join(directory, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return total
