"""Supervised fine-tuning (``--sft``): conversations in, assistant-only loss, packed THD sequences out.

- formats.py: JSONL records (Megatron-LM messages, OpenAI messages, ShareGPT, Alpaca) -> checked messages
- templates.py: chat templates (the tokenizer's own or a named built-in) -> tokens + assistant mask
- packing.py: first-fit-decreasing packing plan, and micro-batches as packed THD or padded rows
- dataset.py: files -> validated, tokenized, cached plan; the per-rank micro-batch iterator
- step.py: the SFT forward step (PackedSeqParams) and the per-token loss
- task.py: the embedded arithmetic task (deterministic, with a held-out split); accuracy.py: its exact match
- config/sft_flags.py: ``--sft`` and its flags
Submodules are imported on use: config/sft_flags.py must stay importable before megatron-core is.
"""
