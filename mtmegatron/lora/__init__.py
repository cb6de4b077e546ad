"""Low-rank adapters (LoRA) over megatron-core's parallel linears: wrapping, adapter-only state, merge.
May assume: megatron-core 0.16.x; parallel state initialised before a model is wrapped."""

from mtmegatron.lora.report import announce  # noqa: E402,F401
from mtmegatron.lora.wrap import adapters, merge, wrap  # noqa: E402,F401  (the package's entry points)
