"""A tiny random HF ``LlavaForConditionalGeneration`` (the reference) and the batches its parity is checked on.

Shapes: CLIP tower of 3 layers (hidden 64, 4 heads, ffn 96) on 32x32 images in 8x8 patches (16 patches + CLS),
``vision_feature_layer -2`` and the "default" strategy (drop CLS: 16 image embeddings per image, from 2 of the 3
layers; the third and ``post_layernorm`` are unused by LLaVA), the 2-layer GELU projector, a 2-layer GQA Llama
(hidden 64, 4 heads, 2 KV groups) with a vocabulary of 320 whose last id (319) is the image token.

Batches are written in OUR input format (one ``-200`` per image in ``tokens``, the images of the batch in sample
order, text padded at the end with id 0) with HF's logits per sample: HF gets the same text with each ``-200``
replaced by its image token repeated ``image_seq_length`` times, one sample at a time (no padding), so sample
``i``'s HF logits are our combined positions ``[0, len_i)``.
Run as a subprocess (``python hf_llava.py DIR``): the test process must not run torch compute before its ranks
start.
"""

from __future__ import annotations

import os
import sys

import torch

IMAGE_TOKEN = 319
VOCAB = 320
IMG_SEQ = 16
TEXT_LEN = 12
OURS_IMAGE = -200
# images per sample of each batch
BATCHES = {"0-images": [0, 0], "1-image": [1, 1], "2-images": [2, 2], "mixed-0-1-2": [0, 1, 2]}


def llava_config(**overrides):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                              image_size=32, patch_size=8, projection_dim=32, layer_norm_eps=1e-5)
    text = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)
    return LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN,
                       image_seq_length=IMG_SEQ, vision_feature_layer=-2, **overrides)


def randomize(model, seed: int = 0) -> None:
    """Non-trivial values everywhere: norm weights around 1, norm biases and linear biases non-zero."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = "norm" in name or "layrnorm" in name
            p.copy_(torch.randn(p.shape, generator=gen) * (0.02 if p.dim() > 1 else 0.1)
                    + (1.0 if norm and name.endswith("weight") else 0.0))


def make_batches(seed: int = 7) -> dict:
    """name -> (tokens [b, T] in our format, images [n, 3, 32, 32], images per sample)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, counts in BATCHES.items():
        rows, images = [], []
        for n in counts:
            text = torch.randint(0, IMAGE_TOKEN, (TEXT_LEN,), generator=gen).tolist()
            spots = sorted(torch.randperm(TEXT_LEN, generator=gen)[:n].tolist())
            for k, spot in enumerate(spots):  # an image before text position `spot`
                text.insert(spot + k, OURS_IMAGE)
            rows.append(text)
            images += [torch.rand(3, 32, 32, generator=gen) * 2 - 1 for _ in range(n)]
        width = max(len(r) for r in rows)
        tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        out[name] = (tokens, torch.stack(images) if images else torch.zeros(0, 3, 32, 32), counts)
    return out


def hf_input(row: list[int], num_images: int) -> torch.Tensor:
    """Our sample (padding removed) as HF input_ids: each -200 -> the image token x IMG_SEQ."""
    ids = []
    for t in row:
        ids += [IMAGE_TOKEN] * IMG_SEQ if t == OURS_IMAGE else [t]
    assert ids.count(IMAGE_TOKEN) == num_images * IMG_SEQ
    return torch.tensor([ids])


def hf_reference(model, batches: dict) -> dict:
    """name -> list of per-sample HF logits [len_i, vocab] (fp32)."""
    reference = {}
    for name, (tokens, images, counts) in batches.items():
        per_sample, first = [], 0
        for i, n in enumerate(counts):
            row = tokens[i, : TEXT_LEN + n].tolist()
            pixels = images[first:first + n]
            first += n
            with torch.no_grad():
                logits = model(input_ids=hf_input(row, n), pixel_values=pixels if n else None).logits
            per_sample.append(logits[0].float())
        reference[name] = per_sample
    return reference


def save_tiny_llava(directory: str, **overrides):
    from transformers import LlavaForConditionalGeneration

    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(llava_config(**overrides)).float().eval()
    randomize(model)
    model.save_pretrained(directory)
    return model


def load_hf(directory: str):
    from transformers import LlavaForConditionalGeneration

    model, info = LlavaForConditionalGeneration.from_pretrained(directory, attn_implementation="eager",
                                                                output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.float().eval()


def main(argv: list[str]) -> None:
    """``hf_llava.py DIR``: the checkpoint + ``reference.pt`` (batches, HF logits, the key names
    ``save_pretrained`` wrote). ``hf_llava.py --logits HF_DIR OUT``: HF's logits on the same batches (for a
    checkpoint written by mcore-to-hf; loading it also proves every key fits)."""
    if argv[0] == "--logits":
        model = load_hf(argv[1])
        torch.save(hf_reference(model, make_batches()), argv[2])
        return
    directory = argv[0]
    save_tiny_llava(directory)
    model = load_hf(directory)  # what a user loads: the saved files, not the in-memory module
    batches = make_batches()
    torch.save({"batches": batches, "logits": hf_reference(model, batches)}, os.path.join(directory, "reference.pt"))


if __name__ == "__main__":
    main(sys.argv[1:])
