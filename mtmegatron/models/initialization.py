"""Where the weights are born and how ``--seed`` fixes them (Megatron-LM's ``--use-cpu-initialization``).

Megatron-LM's default on an accelerator is megatron-core's device init (``use_cpu_initialization=False``): each
rank allocates its shard on its device and fills it there from the model-parallel RNG tracker (a TP rank's
shard from ``seed + 2718 + tp_rank``), so no full weight is ever built on the host. ``--use-cpu-initialization``
takes megatron-core's host path instead: every TP rank draws the full master weight from the host generator and
keeps its shard, so the weights do not depend on the tensor-parallel size (slow and host-memory heavy at 8B+;
the simulated-MUSA lane and the GPU check use it to compare a device run with the cpu backend). On the cpu
backend the device is the host: the host path always runs there (the flag changes nothing).
Seeds as Megatron-LM's ``_set_random_seed``: ``--seed + 100 * pipeline rank`` (``+ 10 * data-parallel rank``
with ``--data-parallel-random-init``) for python, numpy, torch and the tracker. ``--load``/``--finetune`` with a
checkpoint skips the fill (megatron-core's ``perform_initialization=False``; ``skip_initialization``).
The flags are config/initialization_flags.py's.
The functions take the ``Initialization`` section (models/section.py); ``rank_seed`` takes the values training's
``Parallel`` section holds (``seed``, ``data_parallel_random_init``). (training/setup.seed_everything seeds with
``rank_seed``.)
May assume: megatron-core parallel state is initialised when ``rank_seed`` runs, and the backend bridge is
active when ``host_initialization`` / ``describe`` run.
"""

from __future__ import annotations

import contextlib

from mtmegatron.backends.active import active_backend
from mtmegatron.backends.cpu import CPU
from mtmegatron.models.section import Initialization


def host_initialization(init: Initialization) -> bool:
    """megatron-core's ``use_cpu_initialization``: the flag, a backend whose device is the host, or
    ``--init-model-with-meta-device`` (megatron-core's local layers are born on the meta device only on the host
    path; Megatron-FSDP then draws each module's weights as the host path does: training/meta_init.py)."""
    return (bool(init.use_cpu_initialization) or (active_backend() or CPU).device_is_host
            or bool(init.init_model_with_meta_device))


def birth_device(init: Initialization):
    """The context the model is built in: with device init, ``torch.device(<this rank's device>)``, so that what
    megatron-core leaves to torch's default device (torch norms, rotary buffers) is born on the device too
    (Megatron-LM moves those afterwards); with host init, nothing (the host is the default)."""
    if host_initialization(init):
        return contextlib.nullcontext()
    import torch

    from mtmegatron.backends.device import compute_device

    return torch.device(compute_device())


def config_fields(init: Initialization) -> dict:
    """TransformerConfig fields: where the weights are built and whether they are filled at all."""
    return {"use_cpu_initialization": host_initialization(init),
            "perform_initialization": not skip_initialization(init)}  # --load/--finetune overwrite them


def skip_initialization(init: Initialization) -> bool:
    """Every parameter comes from a checkpoint about to be loaded, so random initialisation is skipped (the
    parameters are allocated, not filled): megatron-core's ``perform_initialization=False``. ``HF_DIR`` runs
    convert first and pass ``--load``."""
    if not init.load or init.moe_use_upcycling:
        return False  # upcycling: the dense checkpoint has no router, which is drawn as in a fresh run
    from mtmegatron.utils.checkpoint_dirs import latest_complete_iteration

    return latest_complete_iteration(init.load) is not None  # an empty --load directory starts from scratch


def rank_seed(parallel) -> int:
    """This rank's seed, as Megatron-LM: different pipeline stages (and with --data-parallel-random-init
    different data-parallel ranks) draw from different streams. ``parallel``: training's ``Parallel`` section (its
    ``seed`` and ``data_parallel_random_init``)."""
    from megatron.core import parallel_state

    seed = parallel.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    if parallel.data_parallel_random_init:
        seed += 10 * parallel_state.get_data_parallel_rank()
    return seed


def describe(init: Initialization) -> str:
    """The start-up line: where the weights are born (or that a checkpoint fills them)."""
    if skip_initialization(init):
        return "mtmegatron: init: skipped (every weight comes from the checkpoint in --load)"
    if init.init_model_with_meta_device:
        return ("mtmegatron: init: on the meta device (--init-model-with-meta-device); Megatron-FSDP materialises one "
                "module at a time on this rank's device, each weight drawn where the host init draws it")
    backend = active_backend() or CPU
    device_type = backend.device_type
    if backend.device_is_host:
        return f"mtmegatron: init: on the host (the {backend.name} backend's device), full weights drawn per tensor"
    if init.use_cpu_initialization:
        return (f"mtmegatron: init: on the host, then moved to {device_type} (--use-cpu-initialization: the same "
                f"weights under every tensor-parallel size)")
    return (f"mtmegatron: init: on the {device_type} device, each rank its own shard from megatron-core's RNG tracker "
            f"(Megatron-LM's default; --use-cpu-initialization for host init)")
