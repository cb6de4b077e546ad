"""``--init-model-with-meta-device``: the model is built on the meta device and Megatron-FSDP materialises it.

As Megatron-LM's get_model: the chunks are built under ``torch.device("meta")`` (no parameter storage anywhere),
are not moved to the device, and megatron-core's Megatron-FSDP (``init_model_with_meta_device``, a
TransformerConfig field filled by name) materialises one module at a time on this rank's device, calls its
``reset_parameters`` and copies the result into its parameter buffer, keeping only this rank's shard where the
strategy shards parameters (optim_grads_params); the module's full tensors are then freed. So no rank holds the
whole model at once (with optim/optim_grads each rank keeps full weights in the buffer anyway: one model, never
the build's copy plus the buffer's).
The weights are drawn as megatron-core's host init draws them (models/initialization.host_initialization: the
local layers are born on the meta device only on that path). megatron-core guarantees no equality with a non-meta
init: Megatron-FSDP resets modules in its buffer order (parameters sorted by row length), not in construction
order. Here the local layers' ``reset_parameters`` (patches/local_layers_reset_parameters.py) re-draws each weight
from the host generator state its construction recorded (the MoE router's own ``reset_parameters`` likewise), so
the same seed gives exactly the weights of a run without the flag (measured: identical weights and losses, dense at
DP2 and DP4 = 2 x 2 HSDP, tests/parallel/test_fsdp_hsdp.py; the tiny Mixtral at EP2 under optim by hand). Another
module whose own ``reset_parameters`` draws would draw in Megatron-FSDP's order (seeded, but not the same weights).
May assume: flags validated (fsdp_flags.check_fsdp_args: only with --use-megatron-fsdp and a sharding strategy);
the backend bridge and the patches active.
"""

from __future__ import annotations

import contextlib

import torch
from megatron.core.transformer import TransformerConfig

from mtmegatron.utils.errors import ConfigError


def birth(config: TransformerConfig):
    """The context the model chunks are built in: the meta device, or nothing."""
    return torch.device("meta") if config.init_model_with_meta_device else contextlib.nullcontext()


def check_materialisable(chunks) -> None:
    """One line naming the first module whose meta parameters Megatron-FSDP could not materialise (it calls the
    owning module's ``reset_parameters`` or ``_reset_parameters``; megatron-core would raise mid-wrap)."""
    for chunk in chunks:
        for name, module in chunk.named_modules():
            has_meta = any(p.is_meta for p in module.parameters(recurse=False))
            if has_meta and not (hasattr(module, "reset_parameters") or hasattr(module, "_reset_parameters")):
                raise ConfigError(f"--init-model-with-meta-device: {name or 'the model'} "
                                  f"({type(module).__name__}) has no reset_parameters, which Megatron-FSDP needs to "
                                  "materialise it from the meta device; drop the flag for this model")
