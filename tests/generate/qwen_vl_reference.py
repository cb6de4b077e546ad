"""``python qwen_vl_reference.py ROOT MAX_NEW_TOKENS``: everything the Qwen VL generation test compares against,
made in one subprocess (no torch compute in the pytest process, which forks rank processes):

- ROOT/tokenizer: a character-level HF tokenizer whose special tokens sit at the tiny presets' ids (``<|im_start|>``
  1, ``<|im_end|>`` 2 (its eos), ``<|vision_start|>`` ... ``<|video_pad|>`` 1018-1021; fillers between);
- ROOT/a.png (84x56) and ROOT/b.png (56x112): two random images of different sizes (4x6 and 8x4 patches);
- per family (qwen2-vl, qwen2.5-vl) ROOT/FAMILY/hf: the tiny HF model (``family.hf_config`` of the tiny preset,
  random init, every tensor then perturbed), converted by ``hf_to_mcore`` into ROOT/FAMILY/mcore, and
  ROOT/FAMILY/reference.json: for each prompt of PROMPTS the prompt ids as HF renders them (the tokenizer's
  ``apply_chat_template`` with the released Qwen2-VL template, images as ``{"type": "image"}`` content where the
  prompt's tags are, else first, each followed by a newline as the training records place them; then each
  ``<|image_pad|>`` expanded to one pad per merged patch window of HF's ``Qwen2VLImageProcessorPil`` grid) and
  HF ``generate(do_sample=False)``'s new tokens for that prompt alone, cut before its first ``<|im_end|>``; the same
  for TEXT_PROMPT (plain, no images) under ``"text"``;
- ROOT/text_mcore: a converted tiny Llama (no vision tower) for the refusal test.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIALS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<|vision_start|>": 1018,
            "<|vision_end|>": 1019, "<|image_pad|>": 1020, "<|video_pad|>": 1021}
IMAGE_SIZES = {"a.png": (84, 56), "b.png": (56, 112)}  # (width, height)
# prompt 1: both images first (untagged); prompt 2 places them with <image> tags, the second after
# the end of prompt 1, so a static batch of both merges it in a decode step
PROMPTS = ["Hi", "Look: <image> and then, at last, <image>"]
TEXT_PROMPT = "Hello there, how are you?"
FAMILIES = {"qwen2-vl": "Qwen2VLForConditionalGeneration", "qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration"}


def save_vision_tokenizer(directory: str) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    free = (i for i in range(max(SPECIALS.values())) if i not in SPECIALS.values())
    vocab = dict(SPECIALS)
    vocab.update({char: next(free) for char in ["\n"] + [chr(c) for c in range(32, 127)]})
    vocab.update({f"<x{i}>": i for i in free})  # fillers up to the vision tokens: every id below 1022 decodes
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                   "pad_token": "<|endoftext|>"}, f)


def hf_prompt_ids(tokenizer_dir: str, prompt: str, grids) -> list[int]:
    """HF's rendering: chat template with image content items, each pad expanded by the processor's rule."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "multimodal_data"))
    from test_vision_data import QWEN2_VL_CHAT_TEMPLATE
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tokenizer_dir, "tokenizer.json"))
    if "<image>" not in prompt:  # the training records' rule: the images first, each on its own line
        prompt = "<image>\n" * len(grids) + prompt
    pieces = prompt.split("<image>")
    content = [{"type": "text", "text": pieces[0]}]
    for piece in pieces[1:]:
        content += [{"type": "image"}, {"type": "text", "text": piece}]
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], chat_template=QWEN2_VL_CHAT_TEMPLATE,
                                         tokenize=False, add_generation_prompt=True)
    parts = text.split("<|image_pad|>")
    text = "".join(part + ("<|image_pad|>" * (int(grids[k].prod()) // 4) if k < len(grids) else "")
                   for k, part in enumerate(parts))
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _generate(hf, ids, max_new_tokens: int, **vision) -> list[int]:
    """HF's greedy new tokens for one prompt alone, cut before its first <|im_end|>."""
    eos = SPECIALS["<|im_end|>"]
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                          do_sample=False, eos_token_id=eos, pad_token_id=0, **vision)
    new = out[0, ids.shape[1]:].tolist()
    return new[: new.index(eos)] if eos in new else new


def save_family(root: str, family_name: str, architecture: str, pixels, max_new_tokens: int) -> None:
    """ROOT/FAMILY/{hf, mcore, reference.json} (module docstring)."""
    import transformers
    from megatron.core import parallel_state
    from transformers import PreTrainedTokenizerFast

    from mtmegatron.convert.commands import hf_to_mcore
    from mtmegatron.convert.model import hf_inputs, parse_flags
    from mtmegatron.models import families

    family = families.get(family_name)
    args = parse_flags(["--model", family_name, "--model-size", "tiny", "--micro-batch-size", "1",
                        "--global-batch-size", "1"])
    config = transformers.AutoConfig.for_model(**family.hf_config(**hf_inputs(args)))
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))  # twice the parity test's: greedy text that does not repeat
    out = f"{root}/{family_name}"
    hf.save_pretrained(f"{out}/hf")

    reference = {"prompt_tokens": [], "tokens": [], "grids": pixels["image_grid_thw"].tolist()}
    for prompt in PROMPTS:
        ids = torch.tensor([hf_prompt_ids(f"{root}/tokenizer", prompt, pixels["image_grid_thw"])])
        reference["prompt_tokens"].append(ids[0].tolist())
        reference["tokens"].append(_generate(hf, ids, max_new_tokens, pixel_values=pixels["pixel_values"],
                                             image_grid_thw=pixels["image_grid_thw"],
                                             mm_token_type_ids=(ids == args.image_token_id).int()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=f"{root}/tokenizer/tokenizer.json")
    ids = torch.tensor([tokenizer(TEXT_PROMPT)["input_ids"]])
    reference["text"] = {"prompt_tokens": ids[0].tolist(), "tokens": _generate(hf, ids, max_new_tokens)}
    parallel_state.destroy_model_parallel()  # each converter call sets up its own one-rank parallel state
    hf_to_mcore(f"{out}/hf", f"{out}/mcore", family.name)
    with open(f"{out}/reference.json", "w") as f:
        json.dump(reference, f)


def save_text_model(root: str) -> None:
    """ROOT/text_mcore: a converted tiny random Llama (a model without a vision tower), for the refusal test."""
    import transformers
    from megatron.core import parallel_state

    from mtmegatron.convert.commands import hf_to_mcore
    from mtmegatron.convert.model import hf_inputs, parse_flags
    from mtmegatron.models import families

    args = parse_flags(["--model", "llama3", "--model-size", "tiny", "--micro-batch-size", "1",
                        "--global-batch-size", "1"])
    config = transformers.AutoConfig.for_model(**families.get("llama3").hf_config(**hf_inputs(args)))
    transformers.LlamaForCausalLM(config).save_pretrained(f"{root}/text_hf")
    parallel_state.destroy_model_parallel()
    hf_to_mcore(f"{root}/text_hf", f"{root}/text_mcore", "llama3")


def main(root: str, max_new_tokens: int) -> None:
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    save_vision_tokenizer(f"{root}/tokenizer")
    rng = np.random.default_rng(3)
    images = []
    for name, (width, height) in IMAGE_SIZES.items():
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(f"{root}/{name}")
        images.append(Image.open(f"{root}/{name}"))
    pixels = Qwen2VLImageProcessorPil()(images=images, return_tensors="pt")  # HF's default pixel bounds
    for family_name, architecture in FAMILIES.items():
        save_family(root, family_name, architecture, pixels, max_new_tokens)
    save_text_model(root)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
