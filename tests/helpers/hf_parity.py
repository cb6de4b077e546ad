"""Comparing a converted checkpoint with its HF transformers reference (tests/convert, tests/generate).

``save_reference(family, dir)``: the tiny HF checkpoint of helpers/hf_models.py and its ``reference.pt``, made in a
subprocess (no torch compute in the pytest process, which forks rank processes). ``converted_model`` and
``logits_worker``: our model on one rank of ``run_ranks`` with the converted checkpoint loaded, and its gathered fp32
logits. ``model_flags(mc_dir)``: the converter's recorded model flags for one comparison batch. ``MAX_ABS``: the
logit tolerance (measured: ~2e-7, float reduction order only).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from helpers.cli_subprocess import ENV
from helpers.hf_models import SEQ

MAX_ABS = 1e-4
HF_MODELS = Path(__file__).with_name("hf_models.py")


def save_reference(family: str, directory: Path, shard: bool = False) -> None:
    """The tiny HF checkpoint + reference.pt, made in a subprocess (no torch compute in the forking parent)."""
    command = [sys.executable, str(HF_MODELS), family, str(directory)]
    proc = subprocess.run(command + (["--shard"] if shard else []), capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


def converted_model(world_size, backend_name, flags, checkpoint):
    """(args, model in eval mode) on this rank: the backend active, process groups up, ``checkpoint`` (a
    converter's output) loaded when given."""
    import mtmegatron

    from mtmegatron.backends import get_backend
    from mtmegatron.convert.model import build_model, load_model, parse_flags
    from mtmegatron.training.setup import init_distributed

    args = parse_flags(flags, world_size=world_size)
    backend = get_backend(backend_name)
    mtmegatron.activate(backend)
    init_distributed(args, backend)
    model = build_model(args)
    if checkpoint:
        load_model(model, checkpoint)
    model.eval()
    return args, model


def logits_worker(rank, world_size, backend_name, flags, checkpoint, tokens):
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    _, model = converted_model(world_size, backend_name, flags, checkpoint)
    tokens = torch.as_tensor(tokens)
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        logits = gather_from_tensor_model_parallel_region(model(tokens, positions, None))
    return logits.float() if rank == 0 else None


def model_flags(mc_dir: Path) -> list[str]:
    import shlex

    flags = shlex.split((mc_dir / "model_flags.txt").read_text())
    if "--mtp-num-layers" in flags:  # HF's model has no MTP head; compare the main model's logits
        flags[flags.index("--mtp-num-layers") + 1] = "0"
    return flags + ["--seq-length", str(SEQ), "--micro-batch-size", "1", "--global-batch-size", "2"]
