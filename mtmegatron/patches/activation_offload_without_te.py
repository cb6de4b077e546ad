"""Fine-grained activation offloading without TransformerEngine: megatron-core's offload manager gets a flag holder.

Target: megatron.core.extensions.transformer_engine:cpu_offload (read at call time by
megatron.core.pipeline_parallel.fine_grained_activation_offload's manager on entering and leaving each offload
context).
Reason: the manager moves saved activations to the host with torch's saved-tensor hooks and its own d2h/h2d streams;
from TE it only sets ``cpu_offload.CPUOffloadEnabled`` (so TE's own layers know offloading is on). Without TE
(MUSA without MT-TE, CUDA without TE) the name is None and the manager raises "TE CPU offload is not available"
at the first offloaded layer, although nothing of TE would run. Bound, where it is None, to a holder of that flag:
with TE installed TE's module stays. ``--cpu-offloading-num-layers`` (TE's get_cpu_offload_context) still needs TE.
Versions: megatron-core 0.16.x.
"""

from types import SimpleNamespace

from .base import Patch, resolve, set_attr

TARGET = "megatron.core.extensions.transformer_engine:cpu_offload"


def apply():
    owner, name = resolve(TARGET)
    if not hasattr(owner, name):
        raise RuntimeError(f"{TARGET} is gone; review this patch")
    if getattr(owner, name) is not None:  # TE's cpu_offload module: keep it
        return lambda: None
    return set_attr(TARGET, SimpleNamespace(CPUOffloadEnabled=False))


PATCH = Patch(
    name="activation_offload_without_te",
    target=TARGET,
    reason="fine-grained activation offloading only flags TE's cpu_offload; without TE a holder of that flag serves",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cuda", "musa"),
)
