"""``--transformer-impl transformer_engine`` (Megatron-LM's default): whether TransformerEngine layers can serve it
on this run's backend, decided once from the flags, before any process group.

- CUDA: NVIDIA's TransformerEngine (``transformer_engine``) installed -> its layers, bf16/fp16 and FP8 alike.
- MUSA: Moore Threads' MT-TransformerEngine installed -> its layers. It is a fork that keeps the import name
  ``transformer_engine`` and adds the ``transformer_engine/musa`` package, which is how it is told apart from
  NVIDIA's build (found on disk; nothing is imported here).
- Any other backend (cpu, third-party): no TransformerEngine layers.
Where TE cannot serve the run, Megatron-LM's *implicit* default falls back to ``local`` with one start-up line
naming why (``args.impl_note``); a user who wrote ``--transformer-impl transformer_engine`` gets a one-line error.
The same holds for an FP8 run whose ``--fp8-executor`` names one of mtmegatron's executors: TE's layers run FP8
themselves, so such a run takes local layers (or is refused when TE was asked for by name).
``models/layer_spec.py`` then picks TE's modules for ``transformer_impl == "transformer_engine"``
(``fp8/spec.uses_transformer_engine``).
May assume: flags parsed (``args.backend`` may be None: auto-detect); importing mtmegatron.backends is cheap.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

TE_PACKAGE = "transformer_engine"
OUR_FP8_EXECUTORS = ("scaled_mm", "emulated")


def _is_mt_transformer_engine(spec) -> bool:
    return any(os.path.isdir(os.path.join(path, "musa")) for path in (spec.submodule_search_locations or ()))


def te_layers_missing(device_type: str) -> str | None:
    """Why TransformerEngine layers cannot run on ``device_type``; None when they can."""
    spec = importlib.util.find_spec(TE_PACKAGE)
    if device_type == "cuda":
        return None if spec else "TransformerEngine is not installed (pip install transformer-engine[pytorch])"
    if device_type == "musa":
        if spec is None:
            return "MT-TransformerEngine is not installed"
        if not _is_mt_transformer_engine(spec):
            return "the installed transformer_engine is NVIDIA's build, not MT-TransformerEngine (no musa package)"
        return None
    return f"TransformerEngine has no layers for the {device_type} backend"


def _backend_device_type(args: argparse.Namespace) -> str | None:
    """The device type of the backend this run will select (the same call pretrain makes next)."""
    from mtmegatron.backends import BackendUnavailableError, select_backend

    try:
        return select_backend(args.backend, warn=False).device_type
    except BackendUnavailableError:
        return None  # pretrain reports it with its own message right after parsing


def resolve_transformer_impl(args: argparse.Namespace, given: dict, error) -> None:
    """Keep ``transformer_engine`` where TE serves it, else fall back to ``local`` (implicit default, one line in
    ``args.impl_note``) or ``raise error(...)`` (asked for by name)."""
    args.impl_note = None
    if args.transformer_impl == "inference_optimized":
        raise error("--transformer-impl inference_optimized: inference only (mtmegatron.pretrain trains)")
    if args.transformer_impl != "transformer_engine":
        return
    device_type = _backend_device_type(args)
    why = (f"backend {args.backend} is not available" if device_type is None
           else te_layers_missing(device_type))
    executor = getattr(args, "fp8_executor", "auto")
    if why is None and getattr(args, "fp8_format", None) and executor in OUR_FP8_EXECUTORS:
        why = f"--fp8-executor {executor} runs FP8 in mtmegatron's linears, not in TransformerEngine's layers"
    if why is None:
        return
    if "transformer_impl" in given:
        raise error(f"--transformer-impl transformer_engine: {why} (or use --transformer-impl local / mtmegatron)")
    args.transformer_impl = "local"
    args.impl_note = f"--transformer-impl transformer_engine (Megatron-LM's default): {why}; running local layers"
