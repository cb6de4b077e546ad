"""``--transformer-impl transformer_engine`` (Megatron-LM's default): whether TransformerEngine layers serve it on
this run's backend (the backend answers: ``Backend.transformer_engine_missing``), decided once, before any process
group. Where TE cannot serve the run, Megatron-LM's *implicit* default falls back to ``local`` with one start-up line
naming why (``args.impl_note``); a user who wrote ``--transformer-impl transformer_engine`` gets a one-line error.
The same holds for an FP8 run whose ``--fp8-executor`` names one of mtmegatron's executors: TE's layers run FP8
themselves, so such a run takes local layers (or is refused when TE was asked for by name).
The decision whether this run's layers are TransformerEngine's is made here once, in
``args.transformer_engine_layers``: without FP8, the resolved impl is ``transformer_engine``; with FP8, the executor
is TransformerEngine's (``--fp8-executor transformer_engine``, or ``auto`` on a backend whose first FP8 executor is
TE's and whose TE serves it: the choice ``fp8/spec.choose_executor`` then makes at start-up). Every consumer
(the layer spec through models/gpt.layer_choice's ``LayerChoice``, the grouped-experts checks, the FP8 executor
choice) reads that field. A parse-time step of config/arguments.py (it sets dests), so it lives in config/.
May assume: flags parsed (``args.backend`` may be None: auto-detect); importing mtmegatron.backends is cheap.
"""

from __future__ import annotations

import argparse

OUR_FP8_EXECUTORS = ("scaled_mm", "emulated")


def _backend(args: argparse.Namespace):
    """The backend this run will select (the same call pretrain makes next); None when it is unavailable."""
    from mtmegatron.backends import BackendUnavailableError, select_backend

    try:
        return select_backend(args.backend, warn=False)
    except BackendUnavailableError:
        return None  # pretrain reports it with its own message right after parsing


def _te_fp8_executor(args: argparse.Namespace) -> bool:
    """Whether an FP8 run's executor is TransformerEngine's: asked for by name (``select_executor`` refuses it at
    start-up where the backend does not offer it), or ``auto`` where TE leads the backend's executors and serves
    the backend (``select_executor`` takes the first executor that runs)."""
    executor = args.fp8_executor
    if executor != "auto":
        return executor == "transformer_engine"
    backend = _backend(args)
    return (backend is not None and backend.fp8_executors[:1] == ("transformer_engine",)
            and backend.transformer_engine_missing() is None)


def resolve_transformer_impl(args: argparse.Namespace, given: dict, error) -> None:
    """Keep ``transformer_engine`` where TE serves it, else fall back to ``local`` (implicit default, one line in
    ``args.impl_note``) or ``raise error(...)`` (asked for by name); then record in
    ``args.transformer_engine_layers`` whether the layers are TransformerEngine's (the one decision)."""
    args.impl_note = None
    if args.transformer_impl == "inference_optimized":
        raise error("--transformer-impl inference_optimized: inference only (mtmegatron.pretrain trains)")
    if args.transformer_impl == "transformer_engine":
        _keep_or_fall_back(args, given, error)
    args.transformer_engine_layers = (_te_fp8_executor(args) if args.fp8_format
                                      else args.transformer_impl == "transformer_engine")


def _keep_or_fall_back(args: argparse.Namespace, given: dict, error) -> None:
    backend = _backend(args)
    why = f"backend {args.backend} is not available" if backend is None else backend.transformer_engine_missing()
    executor = args.fp8_executor
    if why is None and args.fp8_format and executor in OUR_FP8_EXECUTORS:
        why = f"--fp8-executor {executor} runs FP8 in mtmegatron's linears, not in TransformerEngine's layers"
    if why is None:
        return
    if "transformer_impl" in given:
        raise error(f"--transformer-impl transformer_engine: {why} (or use --transformer-impl local / mtmegatron)")
    args.transformer_impl = "local"
    args.impl_note = f"--transformer-impl transformer_engine (Megatron-LM's default): {why}; running local layers"
