"""Data pipeline: tokenizers (local HF tokenizer directories or a byte-level BPE trained offline), JSONL/text
to megatron-core indexed datasets (``.bin``/``.idx``), their validation, and the embedded corpus.

May assume: HF ``tokenizers`` and megatron-core are installed; nothing here touches the network.
"""
