"""Vision-language data, two pipelines side by side, one naming rule: a module only one pipeline uses carries its
prefix, a module both use (or a technique named by what it computes) has none.
- LLaVA (tiled fixed-size images): ``llava_conversations.py`` (the LLaVA/ShareGPT JSONL loader with up-front
  validation), ``llava_sample.py`` (one fixed-size sample), ``llava_collate.py`` (the batch contract); entry point
  ``build_multimodal_datasets`` (``build.py``); embedded dataset ``shapes.py``.
- Qwen-VL (native resolution, M-RoPE): ``qwen_vl_records.py``, ``qwen_vl_chat.py``, ``qwen_vl_samples.py``, with
  ``dynamic_resolution.py``, ``mrope_positions.py``, ``micro_batch_balance.py``; embedded dataset ``textures.py``.
- Both: ``records.py`` (the ShareGPT record), ``template.py`` (templates, image tags), ``images.py``,
  ``generated_cache.py``.
May assume: Pillow, numpy, torch, HF ``tokenizers``; nothing here touches the network.
"""
