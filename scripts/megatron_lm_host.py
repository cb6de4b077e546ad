"""Megatron-LM core_v0.16.1's own trainer (``pretrain_gpt.py``) inside a process of ours: the source from a
``git archive`` of the tag, and the start-up work-arounds it needs on the CPU (through mtmegatron's host bridge) or
on a GPU without Triton. Shared by scripts/make_megatron_lm_fixture.py (the Megatron-LM checkpoint fixtures) and
benchmarks/peer_megatron_lm.py (Megatron-LM's row in the step benchmark); nothing of Megatron-LM is kept in the
repository (scripts/device_bundle.sh extracts it into .device/peers/ for the offline GPU machine).

Work-arounds (each only inside the process that calls ``prepare_worker``, none in the product):
- megatron/training/initialize.py imports megatron-core's Triton batch-invariant kernels; where Triton is not
  installed (a CPU box) that module is replaced by one whose functions refuse (batch-invariant mode is not used);
- on the CPU, ``initialize_megatron`` asserts that CUDA is available: the CPU bridge's ``is_available()`` answers
  False on purpose (torch's own code must not take CUDA paths), so Megatron-LM's ``allow_no_cuda=True`` is passed;
- rank 0 compiles megatron/core/datasets helpers and loads fused CUDA kernels (``_compile_dependencies``):
  skipped, everywhere: the installed megatron-core ships its prebuilt ``helpers_cpp``;
- on the CPU, ``set_jit_fusion_options`` warms up torch.compile'd fused bias-GeLU/SwiGLU/dropout-add kernels with
  Inductor, which asks device properties the CPU bridge does not fake: the warm-up is skipped (fusions are off);
- dist_checkpointing's writer spawns a multiprocessing manager, which re-imports the main module: the child
  imports the caller's file instead of pretrain_gpt.py (that would need the stubs again);
- the checkout's ``megatron/core`` is deleted so ``megatron.core`` is the installed megatron-core 0.16.1 (the
  same tag) that mtmegatron's bridge and patches apply to.
May assume: git (for ``extract_megatron_lm``); the installed megatron-core is 0.16.x.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

TAG = "core_v0.16.1"
DEFAULT_REPO = "/work/.mirror/NVIDIA+Megatron-LM/repo"
# what the trainer needs of the tag (the rest, tests/docs/examples ~25 MB, stays out of the bundle)
KEEP = ("pretrain_gpt.py", "gpt_builders.py", "mamba_builders.py", "model_provider.py", "megatron", "LICENSE")


def extract_megatron_lm(repo: str, into: Path, only_trainer: bool = False) -> Path:
    """``git archive`` of the tag into ``into``; its megatron/core removed (the installed one is used).
    ``only_trainer``: just the paths KEEP names (what the bundle carries)."""
    paths = [p for p in KEEP if subprocess.run(["git", "-C", repo, "cat-file", "-e", f"{TAG}:{p}"],
                                               capture_output=True).returncode == 0] if only_trainer else []
    archive = subprocess.run(["git", "-C", repo, "archive", TAG, *paths], check=True, capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    shutil.rmtree(into / "megatron" / "core", ignore_errors=True)
    return into


def _stub_batch_invariant_kernels() -> None:
    name = "megatron.core.transformer.custom_layers.batch_invariant_kernels"
    stub = types.ModuleType(name)

    def refuse(*args, **kwargs):
        raise RuntimeError("batch-invariant mode needs Triton (not installed)")

    for function in ("set_batch_invariant_mode", "disable_batch_invariant_mode", "enable_batch_invariant_mode"):
        setattr(stub, function, refuse)
    stub.is_batch_invariant_mode_enabled = lambda: False
    sys.modules[name] = stub


def _spawn_children_from(main_file: str) -> None:
    import multiprocessing.spawn as spawn

    real = spawn.get_preparation_data

    def preparation_data(name):
        data = real(name)
        data.pop("init_main_from_name", None)
        data["init_main_from_path"] = os.path.abspath(main_file)
        return data

    spawn.get_preparation_data = preparation_data


def prepare_worker(mlm: str, backend: str, main_file: str):
    """Put the Megatron-LM tree ``mlm`` first on sys.path and apply the work-arounds for ``backend`` (cpu: the
    host bridge; cuda/musa: natively, stubs only where Triton is missing). Returns megatron.training.training (the
    caller may wrap its functions before running pretrain_gpt.py)."""
    sys.path.insert(0, mlm)
    if backend != "cuda":
        import mtmegatron

        mtmegatron.activate(backend)
    if importlib.util.find_spec("triton") is None:
        _stub_batch_invariant_kernels()
    import megatron.training.initialize as initialize
    import megatron.training.training as training

    if backend == "cpu":
        real_initialize = training.initialize_megatron
        training.initialize_megatron = lambda *a, **kw: real_initialize(*a, **{**kw, "allow_no_cuda": True})
        initialize._warmup_jit_function = lambda: None
    initialize._compile_dependencies = lambda: None
    _spawn_children_from(main_file)
    return training


def run_pretrain_gpt(mlm: str, flags: list[str]) -> None:
    """Megatron-LM's pretrain_gpt.py as its own __main__, with ``flags``."""
    import runpy

    sys.argv = [os.path.join(mlm, "pretrain_gpt.py"), *flags]
    runpy.run_path(sys.argv[0], run_name="__main__")
