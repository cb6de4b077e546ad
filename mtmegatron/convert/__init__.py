"""HF transformers <-> megatron-core checkpoint conversion for Llama-3, Mixtral and DeepSeek-V3.

``mtmegatron convert hf-to-mcore`` reads an HF safetensors checkpoint (single file or sharded with an index;
DeepSeek FP8 blocks dequantized), builds our model in-process on one CPU rank from the HF config, maps every
tensor, and writes a model-only megatron-core distributed checkpoint that any TP/PP/EP layout loads with
``--load``. ``mcore-to-hf`` goes back. Pieces: the family registry (models/families/: config <-> flags and
the tensor map), hf_io (safetensors), mapping (both directions of the map), llava (LLaVA's key layout and carried
tower), model (the single-rank model), commands (the two commands).
May assume: torch, safetensors; megatron-core is imported when a command runs.
"""
