"""megatron-core's CUDA-graph-safe RNG tracker without graph-safe generator state: one clear refusal, not an assert.

Target: megatron.core.tensor_parallel.random:CudaRNGStatesTracker.__init__ (``initialize_rng_tracker(
use_cudagraphable_rng=True)``; Megatron-LM's CUDA-graph flags, refused at parse time here, are its only users).
Reason: the graph-safe tracker keeps its states as cloned generators and swaps them into the device generator with
``graphsafe_get_state``/``graphsafe_set_state``. On the cpu backend the device generator is torch's CPU generator,
which clones (``clone_state``: ``convert_cuda_rng_state`` round-trips) but has no graph-safe state (torch 2.13:
"graphsafe_get_state is not supported in this Generator"), and there are no CUDA graphs to capture. megatron-core
0.16 says so with ``assert ... "Tried using cudagraphs with RNG, however not detected in pytorch!"`` (gone under
``python -O``, after which the first ``fork()`` fails inside torch). The replacement probes the device generator
and raises one RuntimeError naming the backend; where the generator has graph-safe state it changes nothing. The
simulated MUSA device (tests/musa_sim) has none either (its stand-in torch_musa also has no CUDAGraph: megatron-core
failed there with an AttributeError); whether a real torch_musa's generator has it is not known here, so on musa the
probe decides.
Versions: megatron-core 0.16.x.
"""

import torch

from .base import Patch, current, set_attr

TARGET = "megatron.core.tensor_parallel.random:CudaRNGStatesTracker.__init__"


def device_generator_is_graph_safe() -> bool:
    """Whether the active backend's device generator (the one megatron-core's tracker swaps its states into: torch's
    CPU generator where the device is the host) has graph-safe state."""
    from mtmegatron.backends.active import active_backend

    backend = active_backend()
    generator = (torch.default_generator if backend.device_is_host
                 else backend.device_module().default_generators[0])
    try:
        generator.graphsafe_get_state()
    except (NotImplementedError, RuntimeError):
        return False
    return True


def apply():
    original = current(TARGET)

    def __init__(self, use_cudagraphable_rng=False, is_inference_rng_tracker=False):
        if use_cudagraphable_rng and not device_generator_is_graph_safe():
            from mtmegatron.backends.active import active_backend

            name = getattr(active_backend(), "name", "active")
            raise RuntimeError(f"megatron-core's CUDA-graph-safe RNG tracker (use_cudagraphable_rng) needs a device "
                               f"generator with graph-safe state (graphsafe_get_state); the {name} backend's has none "
                               f"(no CUDA graphs there): use the plain tracker")
        original(self, use_cudagraphable_rng=use_cudagraphable_rng, is_inference_rng_tracker=is_inference_rng_tracker)

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name="graph_safe_rng_tracker_refusal",
    target=TARGET,
    reason="the CUDA-graph-safe RNG tracker on the cpu backend failed on an assert (or, under python -O, inside "
    "torch at the first fork): the CPU generator (and the simulated MUSA one) has no graph-safe state; now one "
    "clear RuntimeError",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu", "musa"),
)
