"""HF ``LlavaForConditionalGeneration`` (CLIP vision tower + 2-layer MLP projector + Llama) <-> ``--model llava``.

Config: ``flags_from_hf(config, names)`` resolves the HF defaults of a partial config.json (LLaVA-1.5's own files
leave most text fields to ``LlamaConfig``'s defaults), refuses what megatron-core's LLaVAModel here cannot
compute the same way (one ``ConversionError`` each) and returns the pretrain flags plus a ``LlavaPlan``.
The language model uses the Llama mapping (mapping.py) under the LLaVA prefixes; the vision tower maps CLIP's
embeddings, ``pre_layrnorm`` -> ``ln_pre`` and the encoder layers (q/k/v + biases -> the per-head interleaved
``linear_qkv``), the projector ``linear_1/linear_2`` -> ``vision_projection.encoder.linear_fc1/linear_fc2``.

Feature layer: LLaVA reads ``hidden_states[vision_feature_layer]`` of the CLIP tower (index 0 = the embeddings
after ``pre_layrnorm``, k = after k layers; ``post_layernorm`` only touches the pooled output, which LLaVA never
reads), so our encoder gets exactly the layers before that point. The HF layers after it and ``post_layernorm``
do not change LLaVA's outputs: they are carried verbatim in ``hf_unused_vision.safetensors`` beside the mcore
checkpoint (names relative to the vision tower, the tower's layer count and feature layer in its metadata), so
HF -> mcore -> HF is bit-exact. Without that file (a checkpoint trained from scratch, or a fine-tuned one the
file was not copied into), mcore -> HF writes the equivalent tower with no extra layer: ``num_hidden_layers`` =
our encoder's layers, ``vision_feature_layer = -1`` (the last layer's output, before ``post_layernorm``) and an
identity ``post_layernorm`` (weight 1, bias 0; it only shapes the pooled output LLaVA ignores).

Key layouts: transformers >= 4.52 keeps ``model.vision_tower.*``, ``model.multi_modal_projector.*``,
``model.language_model.*``, ``lm_head.*`` in memory; the files it saves (5.x) and llava-hf's releases use
``vision_tower.[vision_model.]*``, ``multi_modal_projector.*``, ``language_model.model.*``,
``language_model.lm_head.*``. Every combination is read; the way back writes the layout that was read
(recorded at conversion), else the one transformers 5 saves.

Tokens: our data puts one ``-200`` per image in ``input_ids`` and LLaVAModel expands it to the image embeddings;
HF's ``image_token_index`` (repeated ``image_seq_length`` times by its processor) stays an ordinary row of our
vocabulary, recorded so the way back writes it again (a checkpoint without it needs ``--image-token-id``).
Streaming: nothing here holds the model. ``mcore_sources`` / ``hf_groups`` are what mapping.py's functions of the
same names return for LLaVA, so convert/streaming.py and convert/streaming_export.py plan (meta-device model) and
write this family tensor by tensor like every other; the carried tensors are streamed one at a time too.
May assume: config.json as a plain dict; args from training/arguments.py.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from mtmegatron.convert.hf_config import ConversionError, _llama_like, hf_config_from_args
from mtmegatron.convert.mapping import hf_groups as llama_groups
from mtmegatron.convert.mapping import mcore_sources as llama_sources
from mtmegatron.convert.mapping import qkv_to_hf, qkv_to_mcore

_ST_TORCH = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
             "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "I8": torch.int8, "BOOL": torch.bool}
_ST_ITEMSIZE = {name: torch.empty((), dtype=dt).element_size() for name, dt in _ST_TORCH.items()}

CARRIED_FILE = "hf_unused_vision.safetensors"

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

_LM_CANDIDATES = (("language_model.model.", "language_model.lm_head.weight"), ("model.language_model.", "lm_head.weight"))
_VISION_CANDIDATES = ("vision_tower.vision_model.", "vision_tower.", "model.vision_tower.vision_model.",
                      "model.vision_tower.")
_PROJECTOR_CANDIDATES = ("multi_modal_projector.", "model.multi_modal_projector.")
# what transformers 5's save_pretrained writes (checked by tests/convert/test_llava_parity.py)
DEFAULT_PREFIXES = {"language": "language_model.model.", "head": "language_model.lm_head.weight",
                    "vision": "vision_tower.", "projector": "multi_modal_projector."}


@dataclasses.dataclass
class LlavaPlan:
    """What hf-to-mcore needs beyond the flags: the key prefixes, the tower's layer count and which layers our
    encoder takes, the HF-only config values to record."""

    prefixes: dict
    num_hf_layers: int
    num_used_layers: int
    feature_layer: int
    tied: bool
    record: dict


def _fail(message: str) -> None:
    raise ConversionError(message)


def _with_defaults(config: dict) -> tuple[dict, dict, dict]:
    top = {**LLAVA_DEFAULTS, **config}
    if "image_token_id" in config and "image_token_index" not in config:
        top["image_token_index"] = config["image_token_id"]
    vision_given = config.get("vision_config")
    vision = {**CLIP_VISION_DEFAULTS, **(LLAVA_VISION_DEFAULTS if vision_given is None else {}), **(vision_given or {})}
    text = {**LLAMA_DEFAULTS, **(config.get("text_config") or {})}
    text["num_key_value_heads"] = text["num_key_value_heads"] or text["num_attention_heads"]
    text.setdefault("head_dim", text["hidden_size"] // text["num_attention_heads"])
    return top, vision, text


def _find_prefixes(names) -> dict:
    names = set(names)
    language = [c for c in _LM_CANDIDATES if c[0] + "embed_tokens.weight" in names]
    vision = [p for p in _VISION_CANDIDATES if p + "embeddings.patch_embedding.weight" in names]
    projector = [p for p in _PROJECTOR_CANDIDATES if p + "linear_1.weight" in names]
    if len(language) != 1 or len(vision) != 1 or len(projector) != 1:
        _fail("the checkpoint's tensor names are not a LlavaForConditionalGeneration layout this converter knows "
              f"(language model {[c[0] for c in language]}, vision tower {vision}, projector {projector}; expected "
              "one each of language_model.model./model.language_model., vision_tower.[vision_model.]/"
              "model.vision_tower., multi_modal_projector./model.multi_modal_projector.)")
    return {"language": language[0][0], "head": language[0][1], "vision": vision[0], "projector": projector[0]}


def used_vision_layers(feature_layer, num_hf_layers: int) -> int:
    """How many CLIP layers produce ``hidden_states[feature_layer]`` (index 0 = the embeddings)."""
    if not isinstance(feature_layer, int) or isinstance(feature_layer, bool):
        _fail(f"vision_feature_layer = {feature_layer!r}: only one feature layer (an int) is supported, not "
              f"concatenated layers; not converted")
    used = feature_layer if feature_layer >= 0 else num_hf_layers + 1 + feature_layer
    if not 1 <= used <= num_hf_layers:
        _fail(f"vision_feature_layer = {feature_layer} selects the output of {used} of the tower's {num_hf_layers} "
              f"layers; the encoder needs at least one layer; not converted")
    return used


def flags_from_hf(config: dict, names) -> tuple[list[str], LlavaPlan]:
    """Pretrain flags for the LLaVA model ``config`` describes, and the plan for its tensors."""
    top, vision, text = _with_defaults(config)
    if vision.get("model_type") != "clip_vision_model":
        _fail(f"vision tower {vision.get('model_type')!r}: only CLIP (clip_vision_model) towers are supported "
              f"(SigLIP and others are not mapped); not converted")
    if text.get("model_type") != "llama":
        _fail(f"language model {text.get('model_type')!r}: only Llama language models are supported; not converted")
    strategy = top["vision_feature_select_strategy"]
    if strategy not in ("default", "full"):
        _fail(f"vision_feature_select_strategy = {strategy!r}: only 'default' (drop CLS) and 'full' are supported")
    if top["projector_hidden_act"] != "gelu":
        _fail(f"projector_hidden_act = {top['projector_hidden_act']!r}: the projector here uses exact GELU only")
    if not top["multimodal_projector_bias"]:
        _fail("multimodal_projector_bias = false: the projector here has biases; not converted")
    if vision["hidden_act"] != "quick_gelu":
        _fail(f"vision_config.hidden_act = {vision['hidden_act']!r}: the CLIP encoder here uses quick_gelu only")
    if vision["num_channels"] != 3:
        _fail(f"vision_config.num_channels = {vision['num_channels']}: megatron-core's CLIP takes 3-channel images")
    image, patch = vision["image_size"], vision["patch_size"]
    if not isinstance(image, int) or image % patch:
        _fail(f"vision_config.image_size {image} is not a multiple of patch_size {patch}; not converted")
    num_hf_layers = vision["num_hidden_layers"]
    used = used_vision_layers(top["vision_feature_layer"], num_hf_layers)
    language = _llama_like(text)
    flags = ["--model", "llava"] + language + [
        "--vision-model-type", "clip", "--img-h", str(image), "--img-w", str(image), "--patch-dim", str(patch),
        "--vision-num-layers", str(used), "--vision-hidden-size", str(vision["hidden_size"]),
        "--vision-ffn-hidden-size", str(vision["intermediate_size"]),
        "--vision-num-attention-heads", str(vision["num_attention_heads"]),
        "--vision-norm-epsilon", repr(float(vision["layer_norm_eps"])),
        "--disable-vision-class-token" if strategy == "default" else "--no-disable-vision-class-token",
    ]
    record = {"image_token_index": top["image_token_index"], "image_seq_length": top["image_seq_length"],
              "projection_dim": vision["projection_dim"]}
    plan = LlavaPlan(_find_prefixes(names), num_hf_layers, used, top["vision_feature_layer"],
                     bool(text["tie_word_embeddings"]), record)
    return flags, plan


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


_PROJECTOR_PAIRS = [(f"vision_projection.encoder.linear_fc{i}.{kind}", f"linear_{i}.{kind}")
                    for i in (1, 2) for kind in ("weight", "bias")]


def _language_name(prefixes: dict, llama_name: str) -> str:
    """The LLaVA checkpoint's name of a LlamaForCausalLM tensor name."""
    if llama_name == "lm_head.weight":
        return prefixes["head"]
    assert llama_name.startswith("model."), llama_name
    return prefixes["language"] + llama_name[len("model."):]


def _same(tensor):
    return tensor


def _qkv_to_mcore(heads: int, bias: bool):
    def transform(q, k, v):
        if bias:
            return qkv_to_mcore(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), heads, heads).squeeze(1)
        return qkv_to_mcore(q, k, v, heads, heads)
    return transform


def mcore_sources(args, record: dict) -> dict:
    """``{mcore name: (HF names, transform)}`` of the whole LLaVA model (mapping.mcore_sources' contract): the
    Llama mapping under the recorded language prefixes, the CLIP tower's used layers and the projector."""
    pre = record["prefixes"]
    out = {"language_model." + name: (tuple(_language_name(pre, n) for n in names), transform)
           for name, (names, transform) in llama_sources("llama3", args).items()}
    vp, heads = pre["vision"], args.vision_num_attention_heads
    out["vision_model.class_token"] = ((vp + "embeddings.class_embedding",), lambda t: t.reshape(1, 1, -1))
    for m_name, h_name in _vision_pairs(args.vision_num_layers):
        out["vision_model." + m_name] = ((vp + h_name,), _same)
    for i in range(args.vision_num_layers):
        h = f"{vp}encoder.layers.{i}.self_attn."
        for kind in ("weight", "bias"):
            out[f"vision_model.decoder.layers.{i}.self_attention.linear_qkv.{kind}"] = (
                tuple(f"{h}{x}_proj.{kind}" for x in "qkv"), _qkv_to_mcore(heads, kind == "bias"))
    for m_name, h_name in _PROJECTOR_PAIRS:
        out[m_name] = ((pre["projector"] + h_name,), _same)
    return out


def carried_names(names, plan: LlavaPlan) -> list[str]:
    """HF names (full) of the tower's tensors LLaVA never reads: layers >= the feature layer, post_layernorm,
    and a stored ``position_ids`` buffer."""
    vp, used = plan.prefixes["vision"], plan.num_used_layers
    carried = []
    for name in names:
        if not name.startswith(vp):
            continue
        rest = name[len(vp):]
        if rest.startswith("encoder.layers.") and int(rest.split(".")[2]) >= used:
            carried.append(name)
        elif rest.startswith("post_layernorm.") or rest == "embeddings.position_ids":
            carried.append(name)
    return carried


def unmapped_names(hf, plan: LlavaPlan) -> set[str]:
    """HF names that have no place in the mcore checkpoint and are accounted for: the carried tower tensors, and
    a tied head stored anyway (refused unless it equals the embedding; two tensors read, then dropped)."""
    pre = plan.prefixes
    names = set(carried_names(hf.names, plan))
    if plan.tied and pre["head"] in hf.names:
        if not torch.equal(hf[pre["head"]], hf[pre["language"] + "embed_tokens.weight"]):
            _fail("text_config.tie_word_embeddings is true but the stored lm_head differs from the embedding")
        names.add(pre["head"])
    return names


def write_carried(directory: str, hf_dir: str, plan: LlavaPlan) -> None:
    """The carried tower tensors of the HF checkpoint at ``hf_dir`` into ``directory/CARRIED_FILE`` (names
    relative to the tower, stored dtype and bytes unchanged), streamed: the header from the source headers, then
    one tensor at a time appended (memory: the largest carried tensor)."""
    from mtmegatron.convert.hf_io import HFCheckpoint

    hf = HFCheckpoint(hf_dir, dtype=None, keep_open=False)
    vp = plan.prefixes["vision"]
    names = carried_names(hf.names, plan)
    header = {"__metadata__": {"num_hidden_layers": str(plan.num_hf_layers),
                               "vision_feature_layer": str(plan.feature_layer)}}
    begin = 0
    for name in names:
        shape, dtype = hf.stored(name)
        nbytes = torch.Size(shape).numel() * _ST_ITEMSIZE[dtype]
        header[name[len(vp):]] = {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, begin + nbytes]}
        begin += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(directory, CARRIED_FILE), "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for name in names:
            tensor = hf[name].contiguous()
            f.write(memoryview(tensor.view(-1).view(torch.uint8).numpy()))
            del tensor


def read_carried_layout(path: str, used: int) -> tuple[list[str], int, int] | None:
    """(tensor names relative to the tower, tower layers, feature layer) of the carried file (its header only),
    or None if absent; a file that does not fit this checkpoint's encoder is refused."""
    if not os.path.isfile(path):
        return None
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
        names = list(f.keys())
    num_layers, feature_layer = int(meta["num_hidden_layers"]), int(meta["vision_feature_layer"])
    layers = {int(n.split(".")[2]) for n in names if n.startswith("encoder.layers.")}
    if used_vision_layers(feature_layer, num_layers) != used or layers != set(range(used, num_layers)):
        _fail(f"{path} holds tower layers {sorted(layers)} of {num_layers} (feature layer {feature_layer}), which do "
              f"not continue this checkpoint's {used}-layer encoder; remove it to write the tower without them")
    return names, num_layers, feature_layer


# the tower's ln_pre weight is the input of the groups that write no parameter of ours: its meta tensor tells
# the exporter's planning call (shapes and dtypes from meta tensors) from the real one, and gives the stand-in
# post_layernorm the tower's dtype
_ANCHOR = "vision_model.ln_pre.weight"


def _carried_group(path: str, name: str, hf_name: str):
    def transform(anchor):
        from safetensors import safe_open

        with safe_open(path, "pt") as f:
            if anchor.is_meta:
                piece = f.get_slice(name)
                return {hf_name: torch.empty(piece.get_shape(), dtype=_ST_TORCH[piece.get_dtype()], device="meta")}
            return {hf_name: f.get_tensor(name)}
    return (_ANCHOR,), transform


def hf_groups(args, layout: dict) -> list:
    """The way back as bounded groups (mapping.hf_groups' contract): ``layout`` has the HF key ``prefixes`` and
    the ``carried`` file's path (None: the identity ``post_layernorm`` stand-in is written instead)."""
    pre = layout["prefixes"]

    def renamed(transform):
        return lambda *tensors: {_language_name(pre, k): v for k, v in transform(*tensors).items()}

    def one(hf_name: str):
        return lambda tensor: {hf_name: tensor}

    def qkv(h: str, kind: str):
        def transform(tensor):
            if kind == "bias":
                parts = qkv_to_hf(tensor.unsqueeze(1), heads, heads)
                return {f"{h}{x}_proj.bias": t.squeeze(1) for x, t in zip("qkv", parts)}
            return {f"{h}{x}_proj.weight": t for x, t in zip("qkv", qkv_to_hf(tensor, heads, heads))}
        return transform

    groups = [(tuple("language_model." + n for n in names), renamed(transform))
              for names, transform in llama_groups("llama3", args)]
    vp, heads = pre["vision"], args.vision_num_attention_heads
    groups.append((("vision_model.class_token",), lambda t: {vp + "embeddings.class_embedding": t.reshape(-1)}))
    for m_name, h_name in _vision_pairs(args.vision_num_layers):
        groups.append((("vision_model." + m_name,), one(vp + h_name)))
    for i in range(args.vision_num_layers):
        for kind in ("weight", "bias"):
            groups.append(((f"vision_model.decoder.layers.{i}.self_attention.linear_qkv.{kind}",),
                           qkv(f"{vp}encoder.layers.{i}.self_attn.", kind)))
    for m_name, h_name in _PROJECTOR_PAIRS:
        groups.append(((m_name,), one(pre["projector"] + h_name)))
    carried = layout.get("carried")
    if carried is None:  # the identity post_layernorm of the equivalent tower
        groups.append(((_ANCHOR,), lambda t: {vp + "post_layernorm.weight": torch.ones_like(t),
                                              vp + "post_layernorm.bias": torch.zeros_like(t)}))
    else:
        path, names = carried
        groups += [_carried_group(path, name, vp + name) for name in names]
    return groups


def hf_config(args, record: dict, num_hf_layers: int, feature_layer: int) -> dict:
    """config.json of the LlavaForConditionalGeneration equal to our model (+ the carried layers)."""
    if args.vision_model_type != "clip":
        _fail(f"--vision-model-type {args.vision_model_type}: only the CLIP tower has an HF mapping")
    if args.img_h != args.img_w:
        _fail(f"--img-h {args.img_h} != --img-w {args.img_w}: HF's CLIP tower takes square images")
    text = hf_config_from_args("llama3", args)
    text.pop("architectures")
    text.pop("torch_dtype")
    grid = args.img_h // args.patch_dim
    vision = {"model_type": "clip_vision_model", "hidden_size": args.vision_hidden_size,
              "intermediate_size": args.vision_ffn_hidden_size, "num_hidden_layers": num_hf_layers,
              "num_attention_heads": args.vision_num_attention_heads, "num_channels": 3, "image_size": args.img_h,
              "patch_size": args.patch_dim, "hidden_act": "quick_gelu", "layer_norm_eps": args.vision_norm_epsilon,
              "projection_dim": record.get("projection_dim", LLAVA_VISION_DEFAULTS["projection_dim"])}
    drop_cls = bool(args.disable_vision_class_token)
    return {
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "torch_dtype": "float32",
        "image_token_index": record["image_token_index"],
        "image_seq_length": record.get("image_seq_length", grid * grid + (0 if drop_cls else 1)),
        "projector_hidden_act": "gelu", "multimodal_projector_bias": True, "vision_feature_layer": feature_layer,
        "vision_feature_select_strategy": "default" if drop_cls else "full",
        "tie_word_embeddings": text["tie_word_embeddings"], "text_config": text, "vision_config": vision,
    }


def export_layout(args, record: dict, load: str, image_token_id: int | None) -> tuple[dict, dict]:
    """(config.json, the ``hf_layout`` for mapping.hf_groups) of the LLaVA checkpoint under ``load``; ``record`` is
    what hf-to-mcore stored ({} for a checkpoint trained from scratch). Reads no tensor."""
    record = dict(record)
    if image_token_id is not None:
        record["image_token_index"] = image_token_id
    if record.get("image_token_index") is None:
        _fail(f"{load} does not record an HF image token id (it was not converted from HF): pass "
              f"--image-token-id ID, a vocabulary id the tokenizer never produces for text (HF LLaVA replaces "
              f"that id's positions with image features; our data uses -200 placeholders instead)")
    if not 0 <= record["image_token_index"] < args.vocab_size:
        _fail(f"image token id {record['image_token_index']} is outside the vocabulary (0..{args.vocab_size - 1})")
    path = os.path.join(load, CARRIED_FILE)
    carried = read_carried_layout(path, args.vision_num_layers)
    if carried is None:
        names, num_hf_layers, feature_layer = None, args.vision_num_layers, -1
    else:
        names, num_hf_layers, feature_layer = carried
    layout = {"prefixes": record.get("prefixes", DEFAULT_PREFIXES), "carried": None if names is None else (path, names)}
    return hf_config(args, record, num_hf_layers, feature_layer), {"llava": layout}


def dumps_record(plan: LlavaPlan) -> dict:
    """What hf-to-mcore stores in the checkpoint (common state) for the way back."""
    return {**plan.record, "prefixes": dict(plan.prefixes)}


__all__ = ["CARRIED_FILE", "LlavaPlan", "flags_from_hf", "mcore_sources", "hf_groups", "hf_config", "carried_names",
           "unmapped_names", "read_carried_layout", "write_carried", "used_vision_layers", "dumps_record",
           "export_layout"]
