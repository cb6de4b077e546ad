"""Text generation over a megatron-core model: the KV-cache engine and the recompute (no cache) decoder, shared
by `mtmegatron generate`, SFT accuracy and samples printed during training."""
