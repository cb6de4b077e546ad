"""Build helper for the MUSA kernel extension (UNVERIFIED: no MUSA toolchain or torch_musa exists where this was
written). Ports the CUDA sources into kernels/musa/ (musa_port.py), then compiles them with torch_musa's
MUSAExtension / BuildExtension into `mtmegatron._musa_kernels`, placed inside the installed mtmegatron package
(next to `mtmegatron._C`), never into the repository root. Importing it registers the PrivateUse1 kernels
(mtmegatron.ops.native.load_musa_extension does, and reports a failure instead of swallowing it).

Usage on a MUSA machine (MUSA_HOME set, mcc on PATH, torch_musa 2.11 / 2.9 / 2.7.1 with its torch installed;
scripts/install.sh runs it where it finds mcc and torch_musa):
    TORCH_MUSA_ARCH_LIST="21;22" python -m mtmegatron.ops.musa_build
Without TORCH_MUSA_ARCH_LIST the arch of MUSA device 0 is used (e.g. 22 on an S4000).
The warp size is fixed per target at compile time (MTM_WARP_SIZE, see kernels/musa/include/mtm/musa_common.muh):
one build serves one warp size, so all archs in TORCH_MUSA_ARCH_LIST must share it (checked here).
May assume: torch_musa is importable when build() runs; only torch 2.7 APIs (the MUSA floor, docs/backends.md).
The path helpers need neither.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from .musa_port import KERNELS, MUSA_DIR, port_all, warp_size_for_arch_list

EXTENSION_NAME = "mtmegatron._musa_kernels"


def package_dir() -> Path:
    """The directory the extension goes into: where `mtmegatron._C` is installed (site-packages for both
    `pip install .` and scikit-build-core's editable install), else the mtmegatron package itself."""
    spec = importlib.util.find_spec("mtmegatron._C")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent
    return Path(__file__).resolve().parents[1]


def build_args(build_temp: str) -> list[str]:
    """setuptools arguments: the build lib is the package's parent, so `mtmegatron._musa_kernels` lands inside it."""
    return ["build_ext", "--build-lib", str(package_dir().parent), "--build-temp", build_temp]


def musa_extension(arch_list: str):
    """The MUSAExtension describing the MUSA kernel library (requires torch_musa)."""
    from torch_musa.utils.musa_extension import MUSAExtension

    warp = warp_size_for_arch_list(arch_list)
    sources = sorted(str(p) for p in MUSA_DIR.glob("*.mu")) + [str(MUSA_DIR / "bind_musa.cpp")]
    include_dirs = [str(MUSA_DIR / "include"), str(KERNELS / "include"), str(KERNELS / "bind")]
    return MUSAExtension(
        name=EXTENSION_NAME,
        sources=sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": ["-O3", "-std=c++17"],
                            "mcc": ["-O3", "-std=c++17", f"-DMTM_WARP_SIZE={warp}"]},
    )


def detected_arch_list(musa=None) -> str:
    """TORCH_MUSA_ARCH_LIST for MUSA device 0 ("22" for arch 220); a ValueError when no device is visible."""
    import torch

    from mtmegatron.backends.musa_device import device_arch

    musa = musa if musa is not None else torch.musa
    if musa.device_count() == 0:
        raise ValueError("TORCH_MUSA_ARCH_LIST is not set and no MUSA device is visible to detect it: set it, "
                         "e.g. TORCH_MUSA_ARCH_LIST=22")
    return str(device_arch(0, musa) // 10)


def build(build_temp: str | None = None) -> Path:
    """Port the CUDA sources, then build the extension into the installed package; returns that directory."""
    from setuptools import setup
    from torch_musa.utils.musa_extension import BuildExtension

    arch_list = os.environ.get("TORCH_MUSA_ARCH_LIST", "") or detected_arch_list()
    os.environ["TORCH_MUSA_ARCH_LIST"] = arch_list  # BuildExtension turns it into --offload-arch
    port_all()
    setup(
        name="mtmegatron-musa-kernels",
        ext_modules=[musa_extension(arch_list)],
        cmdclass={"build_ext": BuildExtension},
        script_args=build_args(build_temp or tempfile.mkdtemp(prefix="mtm-musa-build-")),
    )
    return package_dir()


if __name__ == "__main__":
    try:
        import torch_musa  # noqa: F401
    except ImportError as exc:
        sys.exit(f"musa build requested but torch_musa does not import ({exc}); needs torch_musa with its torch + MUSA_HOME")
    try:
        print(f"built {EXTENSION_NAME} into {build()}")
    except ValueError as exc:
        sys.exit(f"musa build: {exc}")
