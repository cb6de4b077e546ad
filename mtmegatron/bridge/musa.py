"""MUSA bridge: Moore Threads' torchada makes ``torch.cuda.*``, ``tensor.cuda()`` and ``device='cuda'``
resolve to torch_musa; ``"nccl"`` process groups become ``"mccl"``.

May assume: torch_musa and torchada are installed (the musa backend checks before this runs).
Unverified: written against torchada's documented behaviour (importing it applies its patches); never run
on MUSA hardware in this project's CI. torchada's patches cannot be undone, so uninstall() only restores the
collective-name mapping.
"""

from __future__ import annotations

import importlib

from . import collectives


def install(backend) -> None:
    importlib.import_module("torch_musa")
    importlib.import_module("torchada")
    collectives.install(backend.dist_backend)


def uninstall() -> None:
    collectives.uninstall()
