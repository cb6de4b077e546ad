"""Build helper for the MUSA kernel extension (UNVERIFIED: no MUSA toolchain or torch_musa exists where this was
written). Compiles the ported sources in kernels/musa/ (`python -m mtmegatron.ops.musa_port` regenerates them)
with torch_musa's MUSAExtension / BuildExtension into the module `mtmegatron_musa_kernels`, which registers the
PrivateUse1 kernels on import (mtmegatron.ops.native.load_musa_extension imports it).

Usage on a MUSA machine (MUSA_HOME set, mcc on PATH, torch 2.7.1 + torch_musa installed):
    TORCH_MUSA_ARCH_LIST="21;22" python -m mtmegatron.ops.musa_build
May assume: torch_musa is importable when this runs; only torch 2.7 APIs.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .musa_port import KERNELS, MUSA_DIR, port_all

EXTENSION_NAME = "mtmegatron_musa_kernels"


def musa_extension():
    """The MUSAExtension describing the MUSA kernel library (requires torch_musa)."""
    from torch_musa.utils.musa_extension import MUSAExtension

    sources = sorted(str(p) for p in MUSA_DIR.glob("*.mu")) + [str(MUSA_DIR / "bind_musa.cpp")]
    include_dirs = [str(MUSA_DIR / "include"), str(KERNELS / "include"), str(KERNELS / "bind")]
    return MUSAExtension(
        name=EXTENSION_NAME,
        sources=sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": ["-O3", "-std=c++17"], "mcc": ["-O3", "-std=c++17"]},
    )


def build(build_dir: str | None = None) -> None:
    """Port the CUDA sources, then build the extension in place next to the mtmegatron package."""
    from setuptools import setup
    from torch_musa.utils.musa_extension import BuildExtension

    port_all()
    args = ["build_ext", "--inplace"] + (["--build-temp", build_dir] if build_dir else [])
    setup(
        name=EXTENSION_NAME,
        ext_modules=[musa_extension()],
        cmdclass={"build_ext": BuildExtension},
        script_args=args,
        package_dir={"": str(Path(__file__).resolve().parents[2])},
    )


if __name__ == "__main__":
    try:
        import torch_musa  # noqa: F401
    except ImportError:
        sys.exit("musa build requested but torch_musa is not installed (needs torch 2.7.1 + torch_musa + MUSA_HOME)")
    build()
