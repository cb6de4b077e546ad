"""The data/run part of ``mtmegatron env`` (alias ``doctor``): the CPU threads a run will use, whether the
FP8 executors the backend prefers can be imported here, and the state of the embedded corpus cache.

May assume: nothing is initialised; only imports and file checks, never starts a device context.
"""

from __future__ import annotations

import importlib.util
import os

from mtmegatron.data import embedded


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def report() -> None:
    import torch

    print(f"cpu: {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"
          f" (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})")
    engines = {"transformer_engine": "TransformerEngine", "mtmegatron.fp8": "mtmegatron.fp8 (our recipes)"}
    print("fp8 libraries: " + ", ".join(f"{label} {'importable' if _importable(m) else 'absent'}"
                                         for m, label in engines.items()))
    cache = embedded.cache_root()
    built = sorted(d for d in os.listdir(cache) if os.path.isfile(os.path.join(cache, d, "complete"))) \
        if os.path.isdir(cache) else []
    print(f"embedded corpus: {embedded.corpus_path()} | preprocessed in {cache}: "
          f"{', '.join(built) if built else 'not yet (made on first pretrain run)'}")
