"""Synthetic HF checkpoints of a chosen size for the converter's benchmark and tests: a Llama-shaped
``config.json`` and random bf16 (or fp32) tensors, one safetensors shard per layer plus the index, written one
shard at a time (memory: one layer); a LLaVA around such a Llama (``write_llava``: a small CLIP tower and the
projector in one more shard). Not a model anyone trained: only the shapes and names are real.

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


def write_llama(directory: str, config: dict, seed: int = 0, prefix: str = "") -> int:
    """Write ``config`` and random weights for it under ``directory``; returns the bytes of weights written.
    ``prefix`` goes before every tensor name (``language_model.``: the language model of a LLaVA)."""
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
        shards[0] = {prefix + name: tensor for name, tensor in shards[0].items()}
        save_file(shards[0], os.path.join(directory, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shards[0]})
        total += sum(t.numel() * t.element_size() for t in shards[0].values())
    with open(os.path.join(directory, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return total


def write_llava(directory: str, text: dict, vision_hidden: int = 256, vision_layers: int = 3, seed: int = 0) -> int:
    """A LlavaForConditionalGeneration checkpoint (llava-hf's key layout): ``text`` (a ``llama_shape_for``
    config) as the language model, a CLIP tower of ``vision_layers`` layers (hidden ``vision_hidden``, FFN 4x,
    32x32 images in 8x8 patches; feature layer -2, so its last layer and ``post_layernorm`` are carried) and the
    projector, in one more shard; returns the bytes of weights written."""
    total = write_llama(directory, text, seed, prefix="language_model.")
    dtype = getattr(torch, text["torch_dtype"])
    gen = torch.Generator().manual_seed(seed + 1)
    h, ffn, hidden = vision_hidden, 4 * vision_hidden, text["hidden_size"]

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(dtype)

    v = "vision_tower.vision_model."
    tensors = {v + "embeddings.class_embedding": rand(h), v + "embeddings.patch_embedding.weight": rand(h, 3, 8, 8),
               v + "embeddings.position_embedding.weight": rand(17, h), v + "pre_layrnorm.weight": rand(h),
               v + "pre_layrnorm.bias": rand(h), v + "post_layernorm.weight": rand(h),
               v + "post_layernorm.bias": rand(h), "multi_modal_projector.linear_1.weight": rand(hidden, h),
               "multi_modal_projector.linear_1.bias": rand(hidden),
               "multi_modal_projector.linear_2.weight": rand(hidden, hidden),
               "multi_modal_projector.linear_2.bias": rand(hidden)}
    for i in range(vision_layers):
        p = f"{v}encoder.layers.{i}."
        for name, shape in (("layer_norm1", (h,)), ("layer_norm2", (h,)), ("self_attn.q_proj", (h, h)),
                            ("self_attn.k_proj", (h, h)), ("self_attn.v_proj", (h, h)), ("self_attn.out_proj", (h, h)),
                            ("mlp.fc1", (ffn, h)), ("mlp.fc2", (h, ffn))):
            tensors[f"{p}{name}.weight"], tensors[f"{p}{name}.bias"] = rand(*shape), rand(shape[0])
    save_file(tensors, os.path.join(directory, "vision.safetensors"), metadata={"format": "pt"})
    total += sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(directory, INDEX)) as f:
        index = json.load(f)
    index["weight_map"].update({name: "vision.safetensors" for name in tensors})
    index["metadata"]["total_size"] = total
    with open(os.path.join(directory, INDEX), "w") as f:
        json.dump(index, f)
    language = {k: v for k, v in text.items() if k != "architectures"}
    vision = dict(model_type="clip_vision_model", hidden_size=h, intermediate_size=ffn, num_hidden_layers=vision_layers,
                  num_attention_heads=h // 64, image_size=32, patch_size=8, projection_dim=h, hidden_act="quick_gelu",
                  layer_norm_eps=1e-5)
    config = dict(model_type="llava", architectures=["LlavaForConditionalGeneration"], image_token_index=
                  text["vocab_size"] - 1, image_seq_length=16, vision_feature_layer=-2, projector_hidden_act="gelu",
                  vision_feature_select_strategy="default", text_config=language, vision_config=vision,
                  torch_dtype=text["torch_dtype"])
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return total
