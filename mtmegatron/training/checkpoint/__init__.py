"""Checkpoints of a training run: torch_dist save/load in any layout, Megatron-LM's conventions, the FSDP engines,
non-persistent saves, and upcycling a dense checkpoint into an MoE model."""
