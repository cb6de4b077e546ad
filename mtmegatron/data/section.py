"""The values data/ reads, by flag dest (issue 36's typed sections): the tokenizer flags (``Tokenizer``), where
the pretraining text is and how ``--split`` divides it (``Splits``), megatron-core's dataset builder options
and the GPT datasets' values (``GptData``) and the batch sizes that decide which samples each iteration reads (``Batches``).
Built once where a run (or ``mtmegatron preprocess``) starts that concern (``X.of(args)``) and handed down.
May assume: the flags were parsed and checked (config/tokenizer_flags.py, config/data_flags.py,
config/schedule_flags.py); ``Tokenizer`` holds only dests that the preprocess parser defines too.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Tokenizer(Section):
    """Megatron-LM's tokenizer flags: what data/tokenizer_build.py builds (megatron-core's build_tokenizer reads
    all of them but ``tokenizer_metadata``, a refused inference-engine flag, always None)."""
    tokenizer_type: str | None                      # --tokenizer-type (None: a local HF tokenizer directory)
    tokenizer_model: str | None                     # its directory or model file
    vocab_file: str | None                          # GPT2BPETokenizer's vocab.json
    merge_file: str | None                          # GPT2BPETokenizer's merges.txt
    vocab_size: int | None                          # NullTokenizer / TikTokenizer size (the model's, in pretrain)
    tokenizer_special_tokens: list | None
    tiktoken_pattern: str | None
    tiktoken_num_special_tokens: int
    tokenizer_sentencepiece_legacy: bool
    tokenizer_hf_use_fast: bool
    tokenizer_hf_include_special_tokens: bool
    trust_remote_code: bool


@dataclass(frozen=True)
class Splits(Section):
    """Where the pretraining text is and how ``--split`` divides one blend (data/splits.py)."""
    data_path: list | None                          # one blend for all splits: P1 P2 ... or W1 P1 W2 P2 ...
    split: str                                      # "969,30,1": train/valid/test shares of --data-path
    train_data_path: list | None                    # a blend per split (instead of --data-path)
    valid_data_path: list | None
    test_data_path: list | None


@dataclass(frozen=True)
class GptData(Section):
    """What megatron-core's GPTDatasetConfig takes from the flags (training/data.py), its builder options as
    Megatron-LM's flags name them (data/dataset_fields.py), and where the datasets' index cache goes."""
    seed: int                                       # the datasets' shuffles
    seq_length: int
    reset_position_ids: bool                        # positions restart at each document
    reset_attention_mask: bool                      # tokens attend only within their document
    eod_mask_loss: bool                             # no loss on the end-of-document token
    create_attention_mask_in_dataloader: bool       # the dataset builds the --reset-attention-mask mask
    mmap_bin_files: bool
    vocab_size: int                                 # the mock data's tokenizer (NullTokenizer --vocab-size V-1)
    data_cache_path: str | None                     # the index cache (resolve.py fills it for real data)
    full_validation: bool                           # one epoch of the valid split
    multiple_validation_sets: bool                  # one valid set per --valid-data-path prefix
    num_dataset_builder_threads: int
    mid_level_dataset_surplus: float
    allow_ambiguous_pad_tokens: bool
    dataloader_fast_cache_load: bool
    dataloader_defer_npy_index_mmap: bool
    per_dataset_sequences_path: str | None          # a JSON file of each dataset's sequence count


@dataclass(frozen=True)
class Batches(Section):
    """The batch sizes that decide the samples of each iteration (data/position.py's ``SamplePlan``, which takes the
    data-parallel size, a value of the layout rather than a flag, beside it)."""
    global_batch_size: int
    micro_batch_size: int
    rampup_batch_size: list | None                  # start increment samples: megatron-core's ramp-up
    iterations_to_skip: list | None                 # consumed, not trained (with the tracker file's, at parse time)
