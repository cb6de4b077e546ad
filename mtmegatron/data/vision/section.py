"""The values data/vision/build.py reads, by flag dest (issue 36's typed sections): LLaVA's conversations, images
and tokenizer (``--data-path``, ``--image-folder``, ``--prompt-format``, the image and tiling flags, ...).
Built by tasks/llava/data.py's ``prepare`` (``LlavaData.of(args)``) and handed to ``build_multimodal_datasets``.
May assume: the LLaVA flags were parsed and checked (models/families/llava/flags.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class LlavaData(Section):
    data_path: list | str | None            # JSONL/JSON conversation files (None: the embedded shapes dataset)
    valid_data_path: list | str | None      # held-out files (None: a --split share of data_path)
    image_folder: str | None                # where the records' image paths point
    prompt_format: str | None               # the chat template (None: the LLaVA family's)
    tokenizer_model: str | None             # a local HF tokenizer (None: a BPE trained on the conversations)
    vocab_size: int                         # the tokenizer must not be larger
    vision_model_type: str | None           # normalization mean/std (None: clip)
    img_h: int
    img_w: int
    use_tiling: bool
    max_num_tiles: int | None
    use_thumbnail: bool
    decoder_seq_length: int                 # every sample's combined (image + text) positions
    skip_bad_samples: bool                  # count and leave out bad samples instead of stopping
    seed: int                               # the held-out subset carved from data_path
    split: str | None                       # its train,valid,test weights (None: 969,30,1)
