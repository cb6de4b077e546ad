"""Build (or find in the cache) the simulated MUSA device extension, csrc/musa_sim.cpp.

What it is for: scripts/musa_sim.sh, tests/helpers/musa_sim.py and the stand-in torch_musa call ``build()``
to get the path of the compiled module. The build goes to ``$MUSA_SIM_CACHE`` (default
``~/.cache/mtmegatron/musa_sim``) under a key made of the torch version and the source hash, so a changed
source or torch rebuilds and an unchanged one is found in milliseconds. Two processes building at once are
serialized by a file lock; the second finds the first one's result.

What it may assume: torch (CPU build is enough) with torch.utils.cpp_extension, ninja and a C++17 compiler.
Never imports torch_musa and never touches PrivateUse1, so it is safe inside a pytest process.

``python tests/musa_sim/build.py`` builds and prints the path of the module.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import sys
import time

SOURCE = pathlib.Path(__file__).resolve().parent / "csrc" / "musa_sim.cpp"
MODULE_NAME = "musa_sim_ext"


def cache_dir() -> pathlib.Path:
    """Directory of the build for this torch and this source (not created)."""
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    key = f"torch{torch.__version__.replace('+', '_')}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"
    root = pathlib.Path(os.environ.get("MUSA_SIM_CACHE", pathlib.Path.home() / ".cache/mtmegatron/musa_sim"))
    return root / key


def _find_module(directory: pathlib.Path) -> pathlib.Path | None:
    found = sorted(directory.glob(f"{MODULE_NAME}*.so"))
    return found[0] if found else None


def build(verbose: bool = False) -> pathlib.Path:
    """Path of the compiled extension module, compiling it first when the cache has none."""
    directory = cache_dir()
    done = directory / "BUILT"
    if done.exists() and (module := _find_module(directory)):
        return module
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists() and (module := _find_module(directory)):
            return module
        from torch.utils import cpp_extension

        print(f"musa_sim: compiling the simulated MUSA device into {directory} (~40 s, once)", file=sys.stderr)
        start = time.perf_counter()
        cpp_extension.load(
            name=MODULE_NAME,
            sources=[str(SOURCE)],
            build_directory=str(directory),
            extra_cflags=["-O2"],
            verbose=verbose,
            is_python_module=True,
        )
        module = _find_module(directory)
        if module is None:
            raise RuntimeError(f"musa_sim: the build in {directory} produced no {MODULE_NAME}*.so")
        done.write_text(f"{time.perf_counter() - start:.1f} s\n")
        return module


if __name__ == "__main__":
    print(build(verbose="-v" in sys.argv))
