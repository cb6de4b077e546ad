"""Memory and layout planning for a run before it starts (`mtmegatron plan`): per-rank footprints from the model
built on the meta device. May assume: the configuration has been parsed and checked (mtmegatron.config)."""
