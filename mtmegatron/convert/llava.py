"""The LLaVA checkpoint's files around the family's config and map (models/families/llava/__init__.py): the HF key layout
read, and the CLIP tower layers LLaVA never reads, carried beside the mcore checkpoint.

Key layouts: transformers >= 4.52 keeps ``model.vision_tower.*``, ``model.multi_modal_projector.*``,
``model.language_model.*``, ``lm_head.*`` in memory; the files it saves (5.x) and llava-hf's releases use
``vision_tower.[vision_model.]*``, ``multi_modal_projector.*``, ``language_model.model.*``,
``language_model.lm_head.*``. Every combination is read; the way back writes the layout that was read
(recorded at conversion), else the one transformers 5 saves.
Carried tensors: the HF layers after the feature layer and ``post_layernorm`` do not change LLaVA's outputs: they
are carried verbatim in ``hf_unused_vision.safetensors`` beside the mcore checkpoint (names relative to the
vision tower, the tower's layer count and feature layer in its metadata), so HF -> mcore -> HF is bit-exact.
Without that file, mcore -> HF writes the equivalent tower with no extra layer (models/families/llava/__init__.py).
Tokens: our data puts one ``-200`` per image in ``input_ids`` and LLaVAModel expands it to the image embeddings;
HF's ``image_token_index`` stays an ordinary row of our vocabulary, recorded so the way back writes it again (a
checkpoint without it needs ``--image-token-id``). Nothing here holds the model; carried tensors stream one at a
time.
May assume: config.json as a plain dict; the values convert/model.hf_inputs filled from the parsed flags.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from mtmegatron.models.families import llava as family
from mtmegatron.models.families.llava import DEFAULT_PREFIXES, ST_TORCH, fail, used_vision_layers

_ST_ITEMSIZE = {name: torch.empty((), dtype=dt).element_size() for name, dt in ST_TORCH.items()}

CARRIED_FILE = "hf_unused_vision.safetensors"

_LM_CANDIDATES = (("language_model.model.", "language_model.lm_head.weight"), ("model.language_model.", "lm_head.weight"))
_VISION_CANDIDATES = ("vision_tower.vision_model.", "vision_tower.", "model.vision_tower.vision_model.",
                      "model.vision_tower.")
_PROJECTOR_CANDIDATES = ("multi_modal_projector.", "model.multi_modal_projector.")


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


def _find_prefixes(names) -> dict:
    names = set(names)
    language = [c for c in _LM_CANDIDATES if c[0] + "embed_tokens.weight" in names]
    vision = [p for p in _VISION_CANDIDATES if p + "embeddings.patch_embedding.weight" in names]
    projector = [p for p in _PROJECTOR_CANDIDATES if p + "linear_1.weight" in names]
    if len(language) != 1 or len(vision) != 1 or len(projector) != 1:
        fail("the checkpoint's tensor names are not a LlavaForConditionalGeneration layout this converter knows "
              f"(language model {[c[0] for c in language]}, vision tower {vision}, projector {projector}; expected "
              "one each of language_model.model./model.language_model., vision_tower.[vision_model.]/"
              "model.vision_tower., multi_modal_projector./model.multi_modal_projector.)")
    return {"language": language[0][0], "head": language[0][1], "vision": vision[0], "projector": projector[0]}


def flags_from_hf(config: dict, names) -> tuple[list[str], LlavaPlan]:
    """Pretrain flags for the LLaVA model ``config`` describes, and the plan for its tensors."""
    flags = family.flags_from_hf(config)
    top, vision, text = family.with_defaults(config)
    record = {"image_token_index": top["image_token_index"], "image_seq_length": top["image_seq_length"],
              "projection_dim": vision["projection_dim"]}
    num_hf_layers = vision["num_hidden_layers"]
    plan = LlavaPlan(_find_prefixes(names), num_hf_layers, used_vision_layers(top["vision_feature_layer"], num_hf_layers),
                     top["vision_feature_layer"], bool(text["tie_word_embeddings"]), record)
    return flags, plan


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
            fail("text_config.tie_word_embeddings is true but the stored lm_head differs from the embedding")
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
        fail(f"{path} holds tower layers {sorted(layers)} of {num_layers} (feature layer {feature_layer}), which do "
              f"not continue this checkpoint's {used}-layer encoder; remove it to write the tower without them")
    return names, num_layers, feature_layer


def export_layout(inputs: dict, record: dict, load: str, image_token_id: int | None) -> tuple[dict, dict]:
    """``inputs``: convert/model.hf_inputs of the checkpoint's flags. (config.json, the ``hf_layout`` for mapping.hf_groups) of the LLaVA checkpoint under ``load``; ``record`` is
    what hf-to-mcore stored ({} for a checkpoint trained from scratch). Reads no tensor."""
    build, llava = inputs["build"], inputs["section"]
    record = dict(record)
    if image_token_id is not None:
        record["image_token_index"] = image_token_id
    if record.get("image_token_index") is None:
        fail(f"{load} does not record an HF image token id (it was not converted from HF): pass "
              f"--image-token-id ID, a vocabulary id the tokenizer never produces for text (HF LLaVA replaces "
              f"that id's positions with image features; our data uses -200 placeholders instead)")
    if not 0 <= record["image_token_index"] < build.vocab_size:
        fail(f"image token id {record['image_token_index']} is outside the vocabulary (0..{build.vocab_size - 1})")
    path = os.path.join(load, CARRIED_FILE)
    carried = read_carried_layout(path, llava.vision_num_layers)
    if carried is None:
        names, num_hf_layers, feature_layer = None, llava.vision_num_layers, -1
    else:
        names, num_hf_layers, feature_layer = carried
    layout = {"prefixes": record.get("prefixes", DEFAULT_PREFIXES), "carried": None if names is None else (path, names)}
    return family.hf_config(**inputs, record=record, num_hf_layers=num_hf_layers, feature_layer=feature_layer), {family.FAMILY.name: layout}


def dumps_record(plan: LlavaPlan) -> dict:
    """What hf-to-mcore stores in the checkpoint (common state) for the way back."""
    return {**plan.record, "prefixes": dict(plan.prefixes)}

