"""Model construction: megatron-core configs and layer specs from flags, presets, initialization."""
