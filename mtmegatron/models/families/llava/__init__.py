"""LLaVA (``--model llava``; HF ``LlavaForConditionalGeneration``): a CLIP-style ViT, a 2-layer MLP projector and a
Llama-style language model (Llama's layer and HF map, gpt.py's as llama3's, under the LLaVA key prefixes).

Presets: LLaVA-1.5 reads the penultimate CLIP layer without its class token, so the encoder here has exactly the
layers whose output is used. HF config: ``flags_from_hf`` resolves the HF defaults of a partial config.json
(LLaVA-1.5's own files leave most text fields to ``LlamaConfig``'s defaults) and refuses what megatron-core's
LLaVAModel cannot compute the same way. Feature layer: LLaVA reads ``hidden_states[vision_feature_layer]`` (index
0 = the embeddings after ``pre_layrnorm``), so our encoder gets the layers before that point; the HF layers after
it and ``post_layernorm`` never change LLaVA's outputs (convert/llava.py carries them in a file beside the
checkpoint; without one the way back writes an identity ``post_layernorm`` and ``vision_feature_layer = -1``).
Map: CLIP's embeddings, ``pre_layrnorm`` -> ``ln_pre``, the encoder layers (q/k/v + biases -> the per-head
``linear_qkv``), the projector ``linear_1/linear_2`` -> ``vision_projection.encoder.linear_fc1/linear_fc2``; the
``layout`` names the key prefixes (``prefixes``) and the carried file (``carried``: (path, names) or None).
May assume: what gpt.py assumes; the multimodal flags are models/families/llava/flags.py's.
"""

from __future__ import annotations

import torch

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import ConversionError, Entry, Family
from mtmegatron.models.families.llava.section import LlavaBuild

_CLIP_L14_336 = dict(vision_model_type="clip", img_h=336, img_w=336, patch_dim=14, vision_num_layers=23,
                     vision_hidden_size=1024, vision_ffn_hidden_size=4096, vision_num_attention_heads=16,
                     vision_norm_epsilon=1e-5, disable_vision_class_token=True)
PRESETS = {
    # a 4-layer language model, a 2-layer ViT on 32x32 images in 8x8 patches: 16 image embeddings per image
    "tiny": dict(
        gpt.LLAMA_COMMON, num_layers=4, hidden_size=128, ffn_hidden_size=352, num_attention_heads=8,
        num_query_groups=4, seq_length=128, vocab_size=1024, rotary_base=500000, vision_model_type="clip",
        img_h=32, img_w=32, patch_dim=8, vision_num_layers=2, vision_hidden_size=64, vision_ffn_hidden_size=256,
        vision_num_attention_heads=4, vision_norm_epsilon=1e-5, disable_vision_class_token=True,
    ),
    # LLaVA-1.5-7B (llava-hf/llava-1.5-7b-hf): CLIP ViT-L/14-336 + Vicuna-7B (Llama-2 shape, no GQA)
    "7b": {
        **gpt.LLAMA_COMMON, **_CLIP_L14_336, "num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 11008,
        "num_attention_heads": 32, "group_query_attention": False, "seq_length": 4096, "vocab_size": 32064,
        "rotary_base": 10000, "layernorm_epsilon": 1e-5, "prompt_format": "vicuna_v1",
    },
}

# HF defaults for the fields read here (transformers' LlavaConfig, CLIPVisionConfig, LlamaConfig), used where a
# config.json leaves them out; tests/convert checks them against the installed transformers.
LLAVA_DEFAULTS = {"image_token_index": 32000, "projector_hidden_act": "gelu", "vision_feature_layer": -2,
                  "vision_feature_select_strategy": "default", "image_seq_length": 576,
                  "multimodal_projector_bias": True, "tie_word_embeddings": False}
LLAVA_VISION_DEFAULTS = {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                         "num_hidden_layers": 24, "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
                         "projection_dim": 768}  # LlavaConfig's own vision tower when vision_config is absent
CLIP_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "projection_dim": 512, "num_hidden_layers": 12,
                        "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 32,
                        "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5}
LLAMA_DEFAULTS = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
                  "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                  "tie_word_embeddings": False, "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False}
# what transformers 5's save_pretrained writes (checked by tests/convert/test_llava_parity.py)
DEFAULT_PREFIXES = {"language": "language_model.model.", "head": "language_model.lm_head.weight",
                    "vision": "vision_tower.", "projector": "multi_modal_projector."}
ST_TORCH = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
            "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "I8": torch.int8, "BOOL": torch.bool}


def fail(message: str) -> None:
    raise ConversionError(message)


def with_defaults(config: dict) -> tuple[dict, dict, dict]:
    """(top-level, vision, text) config with transformers' defaults filled in."""
    top = {**LLAVA_DEFAULTS, **config}
    if "image_token_id" in config and "image_token_index" not in config:
        top["image_token_index"] = config["image_token_id"]
    vision_given = config.get("vision_config")
    vision = {**CLIP_VISION_DEFAULTS, **(LLAVA_VISION_DEFAULTS if vision_given is None else {}), **(vision_given or {})}
    text = {**LLAMA_DEFAULTS, **(config.get("text_config") or {})}
    text["num_key_value_heads"] = text["num_key_value_heads"] or text["num_attention_heads"]
    text.setdefault("head_dim", text["hidden_size"] // text["num_attention_heads"])
    return top, vision, text


def used_vision_layers(feature_layer, num_hf_layers: int) -> int:
    """How many CLIP layers produce ``hidden_states[feature_layer]`` (index 0 = the embeddings)."""
    if not isinstance(feature_layer, int) or isinstance(feature_layer, bool):
        fail(f"vision_feature_layer = {feature_layer!r}: only one feature layer (an int) is supported, not "
              f"concatenated layers; not converted")
    used = feature_layer if feature_layer >= 0 else num_hf_layers + 1 + feature_layer
    if not 1 <= used <= num_hf_layers:
        fail(f"vision_feature_layer = {feature_layer} selects the output of {used} of the tower's {num_hf_layers} "
              f"layers; the encoder needs at least one layer; not converted")
    return used


def flags_from_hf(config: dict, **_) -> list[str]:
    """Pretrain flags for the LLaVA model ``config`` describes."""
    top, vision, text = with_defaults(config)
    if vision.get("model_type") != "clip_vision_model":
        fail(f"vision tower {vision.get('model_type')!r}: only CLIP (clip_vision_model) towers are supported "
              f"(SigLIP and others are not mapped); not converted")
    if text.get("model_type") != gpt.LLAMA_HF["hf_model_type"]:
        fail(f"language model {text.get('model_type')!r}: only Llama language models are supported; not converted")
    strategy = top["vision_feature_select_strategy"]
    if strategy not in ("default", "full"):
        fail(f"vision_feature_select_strategy = {strategy!r}: only 'default' (drop CLS) and 'full' are supported")
    if top["projector_hidden_act"] != "gelu":
        fail(f"projector_hidden_act = {top['projector_hidden_act']!r}: the projector here uses exact GELU only")
    if not top["multimodal_projector_bias"]:
        fail("multimodal_projector_bias = false: the projector here has biases; not converted")
    if vision["hidden_act"] != "quick_gelu":
        fail(f"vision_config.hidden_act = {vision['hidden_act']!r}: the CLIP encoder here uses quick_gelu only")
    if vision["num_channels"] != 3:
        fail(f"vision_config.num_channels = {vision['num_channels']}: megatron-core's CLIP takes 3-channel images")
    image, patch = vision["image_size"], vision["patch_size"]
    if not isinstance(image, int) or image % patch:
        fail(f"vision_config.image_size {image} is not a multiple of patch_size {patch}; not converted")
    used = used_vision_layers(top["vision_feature_layer"], vision["num_hidden_layers"])
    return ["--model", FAMILY.name] + gpt.llama_like_flags(text) + [
        "--vision-model-type", "clip", "--img-h", str(image), "--img-w", str(image), "--patch-dim", str(patch),
        "--vision-num-layers", str(used), "--vision-hidden-size", str(vision["hidden_size"]),
        "--vision-ffn-hidden-size", str(vision["intermediate_size"]),
        "--vision-num-attention-heads", str(vision["num_attention_heads"]),
        "--vision-norm-epsilon", repr(float(vision["layer_norm_eps"])),
        "--disable-vision-class-token" if strategy == "default" else "--no-disable-vision-class-token",
    ]


def hf_config(config, build, record: dict | None = None, num_hf_layers: int | None = None, feature_layer: int = -1,
              section=None, **_) -> dict:
    """config.json of the LlavaForConditionalGeneration equal to our model (+ ``num_hf_layers`` - ours carried
    tower layers); ``record``: the HF-only values recorded at conversion (image token, image_seq_length...)."""
    record, llava = record or {}, section  # section: the LlavaBuild (families/llava/section.py)
    if llava.vision_model_type != "clip":
        fail(f"--vision-model-type {llava.vision_model_type}: only the CLIP tower has an HF mapping")
    if llava.img_h != llava.img_w:
        fail(f"--img-h {llava.img_h} != --img-w {llava.img_w}: HF's CLIP tower takes square images")
    text = gpt.llama_hf_config(config, build)
    text.pop("architectures")
    text.pop("torch_dtype")
    grid = llava.img_h // llava.patch_dim
    vision = {"model_type": "clip_vision_model", "hidden_size": llava.vision_hidden_size,
              "intermediate_size": llava.vision_ffn_hidden_size,
              "num_hidden_layers": num_hf_layers or llava.vision_num_layers,
              "num_attention_heads": llava.vision_num_attention_heads, "num_channels": 3, "image_size": llava.img_h,
              "patch_size": llava.patch_dim, "hidden_act": "quick_gelu", "layer_norm_eps": llava.vision_norm_epsilon,
              "projection_dim": record.get("projection_dim", LLAVA_VISION_DEFAULTS["projection_dim"])}
    drop_cls = bool(llava.disable_vision_class_token)
    return {
        "architectures": [FAMILY.hf_architecture], "model_type": FAMILY.hf_model_type, "torch_dtype": "float32",
        "image_token_index": record["image_token_index"],
        "image_seq_length": record.get("image_seq_length", grid * grid + (0 if drop_cls else 1)),
        "projector_hidden_act": "gelu", "multimodal_projector_bias": True, "vision_feature_layer": feature_layer,
        "vision_feature_select_strategy": "default" if drop_cls else "full",
        "tie_word_embeddings": text["tie_word_embeddings"], "text_config": text, "vision_config": vision,
    }


# ---- tensors ------------------------------------------------------------------------------------------------
def _vision_pairs(num_layers: int) -> list[tuple[str, str]]:
    """(mcore name under vision_model., HF name under the tower) of every tensor but class token and qkv."""
    pairs = [("conv1.weight", "embeddings.patch_embedding.weight"),
             ("position_embeddings.weight", "embeddings.position_embedding.weight"),
             ("ln_pre.weight", "pre_layrnorm.weight"), ("ln_pre.bias", "pre_layrnorm.bias")]
    for i in range(num_layers):
        m, h = f"decoder.layers.{i}.", f"encoder.layers.{i}."
        for kind in ("weight", "bias"):
            pairs += [(f"{m}input_layernorm.{kind}", f"{h}layer_norm1.{kind}"),
                      (f"{m}self_attention.linear_proj.{kind}", f"{h}self_attn.out_proj.{kind}"),
                      (f"{m}pre_mlp_layernorm.{kind}", f"{h}layer_norm2.{kind}"),
                      (f"{m}mlp.linear_fc1.{kind}", f"{h}mlp.fc1.{kind}"),
                      (f"{m}mlp.linear_fc2.{kind}", f"{h}mlp.fc2.{kind}")]
    return pairs


def _language_name(prefixes: dict, llama_name: str) -> str:
    """The LLaVA checkpoint's name of a LlamaForCausalLM tensor name."""
    if llama_name == "lm_head.weight":
        return prefixes["head"]
    assert llama_name.startswith("model."), llama_name
    return prefixes["language"] + llama_name[len("model."):]


def _vision_qkv(mcore: str, hf_prefix: str, kind: str, heads: int) -> Entry:
    """The tower's q/k/v (one group per head); a bias is a one-column weight."""
    entry = gpt.qkv(mcore, hf_prefix, kind, heads, heads)
    if kind == "weight":
        return entry
    return Entry(mcore, entry.hf, lambda *t: entry.to_mcore(*(x.unsqueeze(1) for x in t)).squeeze(1),
                 lambda t: tuple(x.squeeze(1) for x in entry.to_hf(t.unsqueeze(1))))


# the tower's ln_pre weight is the input of the entries that write no parameter of ours: its meta tensor tells
# the exporter's planning call (shapes and dtypes from meta tensors) from the real one, and gives the stand-in
# post_layernorm the tower's dtype
_ANCHOR = "vision_model.ln_pre.weight"


def _carried(path: str, name: str, hf_name: str) -> Entry:
    def read(anchor):
        from safetensors import safe_open  # an optional library, read only for a carried file

        with safe_open(path, "pt") as f:
            if anchor.is_meta:
                piece = f.get_slice(name)
                return (torch.empty(piece.get_shape(), dtype=ST_TORCH[piece.get_dtype()], device="meta"),)
            return (f.get_tensor(name),)
    return Entry(_ANCHOR, (hf_name,), None, read)


def hf_map(config, build, rope_interleave: bool = True, layout=None, section=None, **_) -> list[Entry]:
    pre = layout["prefixes"]
    out = [Entry("language_model." + e.mcore, tuple(_language_name(pre, n) for n in e.hf), e.to_mcore, e.to_hf)
           for e in gpt.decoder_map(config, build)]
    vp, heads = pre["vision"], section.vision_num_attention_heads
    out.append(Entry("vision_model.class_token", (vp + "embeddings.class_embedding",), lambda t: t.reshape(1, 1, -1),
                     lambda t: (t.reshape(-1),)))
    out += [gpt.same("vision_model." + m, vp + h) for m, h in _vision_pairs(section.vision_num_layers)]
    out += [_vision_qkv(f"vision_model.decoder.layers.{i}.self_attention.linear_qkv.{kind}",
                        f"{vp}encoder.layers.{i}.self_attn.", kind, heads)
            for i in range(section.vision_num_layers) for kind in ("weight", "bias")]
    out += [gpt.same(f"vision_projection.encoder.linear_fc{i}.{kind}", f"{pre['projector']}linear_{i}.{kind}")
            for i in (1, 2) for kind in ("weight", "bias")]
    carried = layout.get("carried")
    if carried is None:  # the identity post_layernorm of the equivalent tower
        out.append(Entry(_ANCHOR, (vp + "post_layernorm.weight", vp + "post_layernorm.bias"), None,
                         lambda t: (torch.ones_like(t), torch.zeros_like(t))))
    else:
        path, names = carried
        out += [_carried(path, name, vp + name) for name in names]
    return out


FAMILY = Family(name="llava", presets=PRESETS, hf_model_type="llava", hf_architecture="LlavaForConditionalGeneration",
                flags_from_hf=flags_from_hf, hf_config=hf_config, hf_map=hf_map, hf_section=LlavaBuild, is_multimodal=True,
                chat_template="llama3", task="llava")
