"""The dataset builder's fields of megatron-core's GPTDatasetConfig, from the flags, as Megatron-LM's
``pretrain_gpt.core_gpt_dataset_config_from_args`` fills them: ``--num-dataset-builder-threads``,
``--mid-level-dataset-surplus``, ``--allow-ambiguous-pad-tokens``, ``--dataloader-fast-cache-load``,
``--dataloader-defer-npy-index-mmap`` and ``--per-dataset-sequences-path`` (a JSON file read here).
``dataset_config_fields`` takes data/section.py's ``GptData`` (those flags among its values), built by its caller.
May assume: the flags registered from Megatron-LM's table and checked (config/training_flags.py).
"""

from __future__ import annotations

import json

from mtmegatron.data.section import GptData

# GPTDatasetConfig field <- flag dest (Megatron-LM's pretrain_gpt.core_gpt_dataset_config_from_args)
DATASET_FIELDS = {
    "num_dataset_builder_threads": "num_dataset_builder_threads",
    "mid_level_dataset_surplus": "mid_level_dataset_surplus",
    "allow_ambiguous_pad_tokens": "allow_ambiguous_pad_tokens",
    "fast_cache_load": "dataloader_fast_cache_load",
    "defer_npy_index_mmap": "dataloader_defer_npy_index_mmap",
}


def dataset_config_fields(builder: GptData) -> dict:
    fields = {field: getattr(builder, dest) for field, dest in DATASET_FIELDS.items()}
    if builder.per_dataset_sequences_path is not None:
        with open(builder.per_dataset_sequences_path) as f:
            fields["sequences_per_dataset"] = json.load(f)
    return fields
