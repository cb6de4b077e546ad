"""Low-rank adapters (LoRA) over megatron-core's parallel linears: wrapping, adapter-only state, merge.
May assume: megatron-core 0.16.x; parallel state initialised before a model is wrapped."""
