"""Compile-only check of the CUDA kernel cores: runs `nvcc -c` on every kernels/cuda/*.cu against kernels/include
alone (no torch, no GPU needed), for sm_80 and sm_90, in parallel. Exit status 0 when all compile.

Usage: python kernels/nvcc_check.py [--arch 80 --arch 90] [--nvcc PATH] [--jobs N]
May assume: nvcc on PATH (or --nvcc); the kernel cores are framework-free (that is what this checks).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

KERNELS = Path(__file__).resolve().parent
DEFAULT_ARCHS = ("80", "90")


def cuda_sources() -> list[Path]:
    return sorted((KERNELS / "cuda").glob("*.cu"))


def compile_one(nvcc: str, source: Path, archs: tuple[str, ...], out_dir: str) -> tuple[Path, int, str]:
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    cmd = [nvcc, "-c", "-std=c++17", "-O3", f"-I{KERNELS / 'include'}", *gencode, str(source), "-o",
           os.path.join(out_dir, source.stem + ".o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return source, proc.returncode, proc.stdout + proc.stderr


def check(nvcc: str, archs: tuple[str, ...] = DEFAULT_ARCHS, jobs: int | None = None) -> list[tuple[Path, int, str]]:
    with tempfile.TemporaryDirectory() as out_dir, ThreadPoolExecutor(jobs or os.cpu_count() or 2) as pool:
        return list(pool.map(lambda s: compile_one(nvcc, s, archs, out_dir), cuda_sources()))


def check_cuda_binding(nvcc: str, cxx: str = "g++") -> tuple[int, str]:
    """Syntax-check kernels/bind/cuda.cpp (the CUDA dispatch-key registration) against the installed torch
    headers and nvcc's CUDA headers. A CPU torch lacks the generated c10/cuda/impl/cuda_cmake_macros.h, so an
    empty stand-in is supplied; nothing is linked."""
    import torch.utils.cpp_extension as cpp_ext

    cuda_include = Path(os.path.realpath(nvcc)).parent.parent / "include"
    if not (cuda_include / "cuda_runtime_api.h").exists():  # /usr/local/bin/nvcc may be a wrapper script
        for candidate in sorted(Path("/usr/local").glob("cuda*/include"), reverse=True):
            if (candidate / "cuda_runtime_api.h").exists():
                cuda_include = candidate
                break
    with tempfile.TemporaryDirectory() as stub:
        (Path(stub) / "c10/cuda/impl").mkdir(parents=True)
        (Path(stub) / "c10/cuda/impl/cuda_cmake_macros.h").write_text("#pragma once\n")
        includes = [f"-I{p}" for p in (*cpp_ext.include_paths(), KERNELS / "include", KERNELS / "bind", cuda_include,
                                       stub)]
        cmd = [cxx, "-std=c++17", "-fsyntax-only", *includes, str(KERNELS / "bind" / "cuda.cpp")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", help="SM version, repeatable (default 80 and 90)")
    parser.add_argument("--nvcc", default=shutil.which("nvcc"))
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args()
    if not args.nvcc:
        print("nvcc not found", file=sys.stderr)
        return 2
    results = check(args.nvcc, tuple(args.arch or DEFAULT_ARCHS), args.jobs)
    results.append((KERNELS / "bind" / "cuda.cpp", *check_cuda_binding(args.nvcc)))
    for source, rc, log in results:
        print(f"{'ok  ' if rc == 0 else 'FAIL'} {source.name}")
        if rc != 0:
            print(log)
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
