"""Architecture rule 3: only the bridge and the CUDA/MUSA backend files may name CUDA or its collectives.

Scans every .py file under mtmegatron/ (backends and patches included) for ``torch.cuda``, ``.cuda(``, and the
quoted names ``"nccl"``/``'nccl'``/``"mccl"``/``'mccl'``. Allowed: mtmegatron/bridge/, mtmegatron/backends/cuda.py,
mtmegatron/backends/musa.py, and any line carrying ``# mtm: allow-cuda-name``. Offenders are printed as file:line.
"""

from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
SCANNED_DIRS = ("mtmegatron",)
ALLOWED_DIRS = ("mtmegatron/bridge/",)
ALLOWED_FILES = ("mtmegatron/backends/cuda.py", "mtmegatron/backends/musa.py")
ESCAPE = "# mtm: allow-cuda-name"
PATTERN = re.compile(r"""torch\.cuda|\.cuda\(|"nccl"|'nccl'|"mccl"|'mccl'""")


def find_cuda_names(root: pathlib.Path) -> list[str]:
    """``path:line: text`` for every forbidden name outside the allow-list, relative to ``root``."""
    offenders = []
    for top in SCANNED_DIRS:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(ALLOWED_DIRS) or rel in ALLOWED_FILES:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if PATTERN.search(line) and ESCAPE not in line:
                    offenders.append(f"{rel}:{number}: {line.strip()}")
    return offenders


def test_no_cuda_names_outside_the_bridge():
    offenders = find_cuda_names(REPO)
    for offender in offenders:
        print(offender)
    assert not offenders, (
        "CUDA names outside mtmegatron/bridge/ and mtmegatron/backends/{cuda,musa}.py (route them through the"
        f" bridge, or mark a deliberate line with '{ESCAPE}'):\n" + "\n".join(offenders)
    )


def test_scanner_catches_and_allows(tmp_path):
    files = {
        "mtmegatron/training/loop.py": "import torch\n\ntorch.cuda.synchronize()\n",
        "mtmegatron/training/ok.py": f"torch.cuda.synchronize()  {ESCAPE}\nx = 1\n",
        "mtmegatron/models/move.py": "def f(t):\n    return t.cuda()\n",
        "mtmegatron/bridge/cpu.py": "torch.cuda = shim\ndist.init_process_group('nccl')\n",
        "mtmegatron/backends/cuda.py": "torch.cuda.device_count()\n",
        "mtmegatron/backends/musa.py": 'BACKEND = "mccl"\n',
        "mtmegatron/backends/cpu.py": 'DIST = "nccl"\n',
        "mtmegatron/patches/some_patch.py": "GROUP_BACKEND = 'mccl'\n",
        "mtmegatron/notes.txt": "torch.cuda.synchronize()\n",  # not a .py file
        "mtmegatron/fine.py": "device = 'cpu'  # cudagraph, nccl_allocator are words, not calls\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert sorted(find_cuda_names(tmp_path)) == sorted([
        "mtmegatron/backends/cpu.py:1: DIST = \"nccl\"",
        "mtmegatron/models/move.py:2: return t.cuda()",
        "mtmegatron/training/loop.py:3: torch.cuda.synchronize()",
        "mtmegatron/patches/some_patch.py:1: GROUP_BACKEND = 'mccl'",
    ])
