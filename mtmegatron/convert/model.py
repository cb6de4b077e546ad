"""Our model on one CPU rank, for conversion: build it from pretrain flags, and write/read the model-only
megatron-core distributed checkpoint that ``--load`` takes.

The checkpoint uses training/checkpoint/checkpointing.py's layout (``<dir>/iter_0000000`` + tracker) and its saved
``args`` (the model fingerprint, models/fingerprint.py), plus ``model_only: True`` (no optimizer, scheduler or
RNG state: a run loading it starts at iteration 0 with a fresh optimizer). Sharded tensors carry their global shapes, so any TP/PP/EP layout can
load it; the layout given to the converter is validated, not baked in.
May assume: called in a process that has not initialised torch.distributed (or did so with world size 1).
"""

from __future__ import annotations

import os
import pickle

import torch

from mtmegatron.models import families

MODEL_ONLY_KEY = "model_only"


def parse_flags(flags: list[str], world_size: int = 1):
    from mtmegatron.config.arguments import parse_args

    # a multimodal family's data default is its embedded dataset (its rules refuse mock data); nothing is read here
    model = flags[flags.index("--model") + 1] if "--model" in flags else None
    data = [] if families.get(model).is_multimodal else ["--mock-data"]
    args = parse_args(flags + data + ["--backend", "cpu"], world_size=world_size, for_training=False)
    # the HF mapping names the sequential experts (local_experts.<e>); the torch_dist checkpoint is the same for
    # megatron's grouped experts, so a --moe-grouped-gemm run loads what the converter writes and vice versa
    args.moe_grouped_gemm = False
    return args


def hf_inputs(args) -> dict:
    """What a family's ``hf_config``/``hf_map`` read, filled once from the parsed flags, as their keyword arguments:
    ``config`` (megatron-core's TransformerConfig, models/gpt.transformer_config), ``build`` (models/section.py's
    ModelBuild) and ``section`` (the family's own, ``Family.hf_section``; None without one):
    ``family.hf_map(**hf_inputs(args), rope_interleave=..., layout=...)``."""
    from mtmegatron.models.gpt import transformer_config
    from mtmegatron.models.section import ModelBuild

    hf_section = families.of(args).hf_section
    return {"config": transformer_config(args), "build": ModelBuild.of(args),
            "section": hf_section.of(args) if hf_section else None}


def init_single_rank(args) -> None:
    """Activate the CPU backend and a one-rank process group with the parallel state of ``args``."""
    import mtmegatron
    from mtmegatron.backends import select_backend
    from mtmegatron.training.setup import init_distributed

    backend = select_backend("cpu")
    mtmegatron.activate(backend)
    if not torch.distributed.is_initialized() and "TORCHELASTIC_RUN_ID" not in os.environ:
        # our own one-rank group: never an inherited rank or port (a port the kernel picks at bind time)
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
            os.environ.pop(key, None)
    init_distributed(args, backend)


def build_model(args):
    """The unwrapped GPTModel (fp32, one chunk) for ``args`` on the current parallel state."""
    from mtmegatron.models.gpt import build_model_chunks, transformer_config

    (model,) = build_model_chunks(args, transformer_config(args))
    return model


def saved_args(args) -> dict:
    """The model fingerprint (models/fingerprint.py) that training/checkpoint/checkpointing.py compares on ``--load``."""
    from mtmegatron.models.fingerprint import fingerprint

    return fingerprint(args)


def save_model_only(model, args, root: str, model_flags: list[str] | None = None, hf_layout: dict | None = None) -> str:
    from megatron.core import dist_checkpointing

    from mtmegatron.utils.checkpoint_dirs import TRACKER, checkpoint_dir

    directory = checkpoint_dir(root, 0)
    os.makedirs(directory, exist_ok=True)
    state = {"model": model.sharded_state_dict(), "iteration": 0, "args": saved_args(args), MODEL_ONLY_KEY: True,
             "model_flags": list(model_flags or []), "hf_layout": dict(hf_layout or {})}
    dist_checkpointing.save(state, directory)
    with open(os.path.join(root, TRACKER), "w") as f:
        f.write("0")
    return directory


def load_model(model, root: str) -> None:
    """Load the latest checkpoint under ``root`` (model weights only) into ``model``."""
    from megatron.core import dist_checkpointing

    from mtmegatron.utils.checkpoint_dirs import CheckpointError, checkpoint_dir, latest_iteration

    iteration = latest_iteration(root)
    if iteration is None:
        raise CheckpointError(f"{root}: no complete checkpoint (no tracker file)")
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, checkpoint_dir(root, iteration))
    model.load_state_dict(loaded["model"])


def checkpoint_common(root: str, flag: str = "--load") -> dict:
    """The non-tensor part of the latest complete checkpoint under ``root`` (args, iteration, model_flags...), its
    directory under ``"directory"``; a CheckpointError line when there is none or it cannot be read."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.core import CheckpointingException

    from mtmegatron.utils.checkpoint_dirs import TRACKER, CheckpointError, checkpoint_dir, latest_complete_iteration

    if not os.path.isdir(root):
        raise CheckpointError(f"{flag} {root}: no such directory")
    iteration = latest_complete_iteration(root)
    if iteration is None:
        raise CheckpointError(f"{flag} {root}: no complete checkpoint there (no {TRACKER} naming a finished "
                              f"iter_* directory)")
    directory = checkpoint_dir(root, iteration)
    try:
        common = dist_checkpointing.load_common_state_dict(directory)
    except (CheckpointingException, OSError, RuntimeError, EOFError, pickle.UnpicklingError, TypeError, KeyError,
            ValueError) as e:  # a metadata.json or common.pt that is not what megatron-core wrote
        reason = "its common.pt is not a file torch.save wrote" if isinstance(e, pickle.UnpicklingError) else \
            type(e).__name__ + "".join(f": {line}" for line in str(e).strip().splitlines()[:1])
        raise CheckpointError(f"{flag} {root}: {directory} is not a readable megatron-core checkpoint "
                              f"({reason})") from None
    common["directory"] = directory
    return common
