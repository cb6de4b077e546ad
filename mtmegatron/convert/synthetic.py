"""Synthetic HF checkpoints of a chosen size for the converter's benchmark and tests: a Llama-shaped
``config.json`` and random bf16 (or fp32) tensors, one safetensors shard per layer plus the index, written one
shard at a time (memory: one layer); a LLaVA around such a Llama (``write_llava``: a small CLIP tower and the
projector in one more shard); a DeepSeek-V3-shaped one (``deepseek_shape_for`` + ``write_from_config``: names and
shapes from transformers' model of the config on the meta device, in the released per-expert layout). Not a model
anyone trained: only the shapes and names are real.

May assume: the ``safetensors`` package; ``transformers`` (>= 5) for ``write_from_config``.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from mtmegatron.convert.hf_io import INDEX
from mtmegatron.models.families.deepseek_v3 import FAMILY as deepseek
from mtmegatron.models.families.llava import FAMILY as llava


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
    _write_index_and_config(directory, weight_map, total, config)
    return total


def _write_index_and_config(directory: str, weight_map: dict, total: int, config: dict) -> None:
    with open(os.path.join(directory, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


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
    config = dict(model_type=llava.hf_model_type, architectures=[llava.hf_architecture], image_token_index=
                  text["vocab_size"] - 1, image_seq_length=16, vision_feature_layer=-2, projector_hidden_act="gelu",
                  vision_feature_select_strategy="default", text_config=language, vision_config=vision,
                  torch_dtype=text["torch_dtype"])
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return total


def deepseek_shape_for(total_bytes: int, hidden: int = 1024, experts: int = 16,
                       dtype: torch.dtype = torch.bfloat16) -> dict:
    """A DeepSeek-V3-shaped config (MLA, one dense layer then MoE layers of ``experts`` routed experts top-4 and
    one shared expert, FFN sizes 3x hidden dense and hidden/2 per expert, vocab 8192, no MTP layer) with about
    ``total_bytes`` of weights; the layer sizes come from transformers' own model built on the meta device."""
    size = torch.empty((), dtype=dtype).element_size()
    config = dict(model_type=deepseek.hf_model_type, architectures=[deepseek.hf_architecture], hidden_size=hidden,
                  intermediate_size=3 * hidden, moe_intermediate_size=hidden // 2, num_attention_heads=hidden // 128,
                  num_key_value_heads=hidden // 128, n_routed_experts=experts, n_shared_experts=1,
                  num_experts_per_tok=4, n_group=4, topk_group=2, first_k_dense_replace=1,
                  q_lora_rank=hidden // 2, kv_lora_rank=hidden // 4, qk_nope_head_dim=128, qk_rope_head_dim=64,
                  v_head_dim=128, routed_scaling_factor=2.5, vocab_size=8192, max_position_embeddings=4096,
                  num_nextn_predict_layers=0, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0,
                  torch_dtype={torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype])
    layer_bytes = {}
    for name, shape in _hf_shapes(dict(config, num_hidden_layers=2)).items():
        key = _layer_of(name)
        layer_bytes[key] = layer_bytes.get(key, 0) + torch.Size(shape).numel() * size
    moe_layers = max(1, round((total_bytes - layer_bytes["rest"] - layer_bytes["0"]) / layer_bytes["1"]))
    return dict(config, num_hidden_layers=1 + moe_layers)


def _layer_of(name: str) -> str:
    """The decoder layer index of an HF tensor name ("model.layers.3.mlp..." -> "3"), else "rest"."""
    return name.split(".")[2] if name.startswith("model.layers.") else "rest"


def _hf_shapes(config: dict) -> dict:
    """HF tensor name -> shape of every tensor a checkpoint of ``config`` holds: transformers' model on meta, its
    fused expert tensors (transformers >= 5 stacks them in memory) split back into the released per-expert names."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    out = {}
    for name, t in model.state_dict().items():
        stem, _, last = name.rpartition(".")
        if stem.endswith("mlp.experts") and last == "gate_up_proj":        # [experts, 2 x ffn, hidden]
            for e in range(t.shape[0]):
                out[f"{stem}.{e}.gate_proj.weight"] = out[f"{stem}.{e}.up_proj.weight"] = (t.shape[1] // 2, t.shape[2])
        elif stem.endswith("mlp.experts") and last == "down_proj":         # [experts, hidden, ffn]
            for e in range(t.shape[0]):
                out[f"{stem}.{e}.down_proj.weight"] = (t.shape[1], t.shape[2])
        else:
            out[name] = tuple(t.shape)
    return out


def write_from_config(directory: str, config: dict, seed: int = 0) -> int:
    """Random weights for any ``config`` transformers knows (its model's state-dict names and shapes), one shard
    per decoder layer plus one for the rest, written one shard at a time (memory: one layer); norms are ones,
    DeepSeek's router correction biases fp32 zeros as released. Returns the bytes of weights written."""
    os.makedirs(directory, exist_ok=True)
    dtype = getattr(torch, config["torch_dtype"])
    gen = torch.Generator().manual_seed(seed)
    by_shard: dict[str, dict[str, tuple]] = {}
    for name, shape in _hf_shapes(config).items():
        by_shard.setdefault(_layer_of(name), {})[name] = shape
    files = [k for k in by_shard if k == "rest"] + sorted((k for k in by_shard if k != "rest"), key=int)
    weight_map, total = {}, 0
    for n, key in enumerate(files):
        tensors = {}
        for name, shape in by_shard[key].items():
            if name.endswith("e_score_correction_bias"):
                tensors[name] = torch.zeros(shape, dtype=torch.float32)
            elif "norm" in name:
                tensors[name] = torch.ones(shape, dtype=dtype)
            else:
                tensors[name] = (torch.randn(*shape, generator=gen) * 0.02).to(dtype)
        file = f"model-{n + 1:05d}-of-{len(files):05d}.safetensors"
        save_file(tensors, os.path.join(directory, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    _write_index_and_config(directory, weight_map, total, config)
    return total
