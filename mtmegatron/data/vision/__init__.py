"""Multimodal (LLaVA) data: conversation templates, image preprocessing and tiling, the LLaVA/ShareGPT JSONL
loader with up-front validation, the batch collator, and an embedded procedurally generated image QA dataset.

Entry point for training: ``build_multimodal_datasets`` (``build.py``). Batch contract: ``collate.py``.
May assume: Pillow, numpy, torch, HF ``tokenizers``; nothing here touches the network.
"""
