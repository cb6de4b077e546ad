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
The decision whether this run's layers are TransformerEngine's is made here once, in
``args.transformer_engine_layers``: without FP8, the resolved impl is ``transformer_engine``; with FP8, the executor
is TransformerEngine's (``--fp8-executor transformer_engine``, or ``auto`` on a backend whose first FP8 executor is
TE's and whose TE serves it: the choice ``fp8/spec.resolve_executor`` then makes at start-up). Every consumer
(``models/layer_spec.py`` through ``fp8/spec.uses_transformer_engine``, ``models/grouped_experts.py``, the FP8
executor choice) reads that field.
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


def _backend(args: argparse.Namespace):
    """The backend this run will select (the same call pretrain makes next); None when it is unavailable."""
    from mtmegatron.backends import BackendUnavailableError, select_backend

    try:
        return select_backend(args.backend, warn=False)
    except BackendUnavailableError:
        return None  # pretrain reports it with its own message right after parsing


def _backend_device_type(args: argparse.Namespace) -> str | None:
    backend = _backend(args)
    return backend.device_type if backend is not None else None


def _te_fp8_executor(args: argparse.Namespace) -> bool:
    """Whether an FP8 run's executor is TransformerEngine's: asked for by name (``select_executor`` refuses it at
    start-up where the backend does not offer it), or ``auto`` where TE leads the backend's executors and serves
    the backend (``select_executor`` takes the first executor that runs)."""
    executor = getattr(args, "fp8_executor", "auto")
    if executor != "auto":
        return executor == "transformer_engine"
    backend = _backend(args)
    return (backend is not None and backend.fp8_executors[:1] == ("transformer_engine",)
            and te_layers_missing(backend.device_type) is None)


def resolve_transformer_impl(args: argparse.Namespace, given: dict, error) -> None:
    """Keep ``transformer_engine`` where TE serves it, else fall back to ``local`` (implicit default, one line in
    ``args.impl_note``) or ``raise error(...)`` (asked for by name); then record in
    ``args.transformer_engine_layers`` whether the layers are TransformerEngine's (the one decision)."""
    args.impl_note = None
    if args.transformer_impl == "inference_optimized":
        raise error("--transformer-impl inference_optimized: inference only (mtmegatron.pretrain trains)")
    if args.transformer_impl == "transformer_engine":
        _keep_or_fall_back(args, given, error)
    args.transformer_engine_layers = (_te_fp8_executor(args) if getattr(args, "fp8_format", None)
                                      else args.transformer_impl == "transformer_engine")


def _keep_or_fall_back(args: argparse.Namespace, given: dict, error) -> None:
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
