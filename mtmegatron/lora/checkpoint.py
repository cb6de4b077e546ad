"""What a LoRA run's checkpoint holds: its adapters (+ optimizer state, RNG, schedule, written by
training/checkpoint/checkpointing.py) and a record of the base they belong to; never the frozen base weights.

``record(lora, load, model)`` is stored in the checkpoint's common state: rank, alpha, targets, the adapters'
layout (``LAYOUT``: fused linears with one A block per part, adapter.py), the base's ``--load`` path and the base's
fingerprint (models/fingerprint.py: every flag that fixes a parameter shape or the forward's math).
``check(record, part, directory, lora, model)`` refuses, in one line, a base directory that holds adapters, an
adapter directory that holds none, adapters of an older layout (one A shared by q/k/v and gate/up: their A's shapes differ) and
adapters made for another base or with another rank/alpha/targets. ``select(state, ...)``
keeps one part (``"adapters"`` or ``"base"``) of a model's sharded state dict. ``lora`` is the run's LoRA section
(section.py); ``model`` the base's model flags, handed to models/fingerprint.py only (never read here).
May assume: adapters are the ``lora.`` children of the base linears (adapter.py).
"""

from __future__ import annotations

import os

from mtmegatron.lora.section import Lora
from mtmegatron.models.fingerprint import describe_mismatches, fingerprint, mismatches
from mtmegatron.utils.checkpoint_dirs import CheckpointError

MARK = ".lora."
LAYOUT = "per-part"  # fused linears: one A block per part (q, k, v; gate, up), as HF peft


def is_adapter(key: str) -> bool:
    return MARK in key


def select(state: dict, model_keys: list[str], part: str) -> dict:
    """``state`` with each model chunk's sharded state dict cut to the adapter keys or to the base keys."""
    keep = is_adapter if part == "adapters" else (lambda key: not is_adapter(key))
    out = dict(state)
    for key in model_keys:
        out[key] = {k: v for k, v in state[key].items() if keep(k)}
    return out


def record(lora: Lora, load: str | None, model) -> dict:
    """The record of adapters trained with ``lora`` over the base ``load`` (its ``--load``) of flags ``model``."""
    return {"r": lora.lora_r, "alpha": lora.lora_alpha, "targets": sorted(lora.lora_target_modules), "layout": LAYOUT,
            "base": os.path.abspath(load) if load else None, "base_fingerprint": fingerprint(model)}


def adopt(run, saved: dict | None, lora_load: str) -> None:
    """Give ``run`` (a writable namespace of the base's flags, for merging or generating) the adapters of
    ``lora_load``: their rank, alpha and targets from their record ``saved`` (when they have one; ``check`` refuses
    them otherwise), no dropout, adapters in the base's dtype (merging folds them into it)."""
    run.lora_load, run.lora_dropout, run.lora_fp32_adapters = lora_load, 0.0, False
    if saved is not None:
        run.lora_r, run.lora_alpha, run.lora_target_modules = saved["r"], saved["alpha"], saved["targets"]


def check(saved: dict | None, part: str | None, directory: str, lora: Lora, model) -> None:
    """Refuse a checkpoint for this ``part`` of a load (None: a run without LoRA; "base": --load of a LoRA run;
    "adapters": its --lora-load). ``saved`` is the checkpoint's record (None when it holds no adapters)."""
    if saved is not None and part != "adapters":
        raise CheckpointError(f"checkpoint {directory} holds LoRA adapters only (base {saved['base']}): load them "
                              f"with --load BASE --lora-load {os.path.dirname(directory)} --lora-r {saved['r']}")
    if part != "adapters":
        return
    if saved is None:
        raise CheckpointError(f"--lora-load {lora.lora_load}: checkpoint {directory} holds no LoRA adapters")
    if saved.get("layout") != LAYOUT:
        raise CheckpointError(f"--lora-load {lora.lora_load}: adapters written before per-part adapters (one A "
                              f"shared by q/k/v and gate/up); export them with a mtmegatron of that time "
                              f"(mcore-to-hf --peft-out) and import the PEFT adapter with hf-to-mcore --peft-in")
    found = mismatches(saved["base_fingerprint"], model)
    if found:
        raise CheckpointError(f"--lora-load {lora.lora_load}: adapters made for another base "
                              f"({describe_mismatches(found, model)}; their base: {saved['base']})")
    ours = record(lora, None, model)
    for field, flag in (("r", "--lora-r"), ("alpha", "--lora-alpha"), ("targets", "--lora-target-modules")):
        if saved[field] != ours[field]:
            raise CheckpointError(f"--lora-load {lora.lora_load}: adapters with {flag} {saved[field]}, this run "
                                  f"has {ours[field]}")
