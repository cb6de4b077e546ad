"""``mcore-to-hf --load BASE --lora-load ADAPTERS --peft-out DIR``: a LoRA run's adapters as an HF PEFT adapter
(``adapter_config.json`` + ``adapter_model.safetensors``, HF's module names: q_proj ... down_proj).

Each adapter's B is split by the family's own HF map for the weight it adapts (the rows of fused q/k/v per
query group, [gate; up]), its A shared by the parts: ``W_q + s * B_q @ A`` is exactly the q rows of the fused
``W + s * B @ A``, so the PEFT adapter computes what our adapters do. Keys as peft saves them:
``base_model.model.<HF module>.lora_A.weight`` / ``lora_B.weight``.
May assume: a family whose HF map names each adapted weight (the dense decoder families).
"""

from __future__ import annotations

import json
import os

import torch

from mtmegatron.models.families import ConversionError


def peft_tensors(adapters, run, entries: dict) -> dict[str, torch.Tensor]:
    """``{peft key: tensor}`` from the adapter reader; ``entries``: the family's HF map by mcore name."""
    out = {}
    for local in sorted(adapters.chunks_of):
        if not local.endswith(".lora.lora_a"):
            continue
        stem = local[:-len("lora.lora_a")]
        entry = entries.get(stem + "weight")
        if entry is None:
            raise ConversionError(f"--peft-out: the HF map has no weight {stem}weight for its adapter")
        a, b = adapters.read(local), adapters.read(stem + "lora.lora_b")
        for name, part in zip(entry.hf, entry.to_hf(b)):
            module = "base_model.model." + name[:-len(".weight")]
            out[module + ".lora_A.weight"] = a.clone().contiguous()
            out[module + ".lora_B.weight"] = part.clone().contiguous()
    return out


def write_peft(out: str, tensors: dict, run, base: str) -> dict:
    """``adapter_config.json`` + ``adapter_model.safetensors`` in ``out`` (which must not exist); returns the
    config."""
    from safetensors.torch import save_file

    if os.path.exists(out):
        raise ConversionError(f"--peft-out {out} already exists; remove it or choose another directory")
    targets = sorted({key.split(".")[-3] for key in tensors})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": run.lora_r, "lora_alpha": run.lora_alpha,
              "lora_dropout": 0.0, "target_modules": targets, "bias": "none", "fan_in_fan_out": False,
              "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True,
              "modules_to_save": None, "base_model_name_or_path": os.path.abspath(base)}
    staging = f"{out.rstrip('/')}.partial.{os.getpid()}"
    os.makedirs(staging)
    save_file(tensors, os.path.join(staging, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(staging, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    os.replace(staging, out)
    return config


def export_peft(load: str, lora_load: str, out: str, family: str, args, rope_interleave: bool) -> dict:
    """The PEFT adapter of ``lora_load`` (adapters over the base under ``load``) in ``out``; returns its config."""
    from mtmegatron.convert.lora_merge import adapter_reader
    from mtmegatron.convert.model import init_single_rank
    from mtmegatron.convert.streaming_export import _Reader
    from mtmegatron.models import families

    from megatron.core import parallel_state

    init_single_rank(args)
    try:
        adapters, run = adapter_reader(_Reader, args, lora_load)
        entries = {e.mcore: e for e in families.get(family).hf_map(args, rope_interleave=rope_interleave,
                                                                  layout=None)}
        tensors = peft_tensors(adapters, run, entries)
    finally:  # the merged export, when asked for too, sets up its own one-rank parallel state
        parallel_state.destroy_model_parallel()
    return write_peft(out, tensors, run, load)
