"""A plain ``pip wheel .`` (isolated build, as ``pip install .`` does) builds against the torch that is
already installed, never a downloaded one, and the wheel carries the mapped packages and the native module."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_isolated_wheel_build_uses_installed_torch_and_maps_packages(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    wheels = list(tmp_path.glob("mtmegatron-*.whl"))
    assert len(wheels) == 1, list(tmp_path.iterdir())
    assert not list(tmp_path.glob("torch-*.whl"))
    names = zipfile.ZipFile(wheels[0]).namelist()
    for required in ("mtmegatron/__init__.py", "mtmegatron/backends/__init__.py", "mtmegatron/backends/musa.py",
                     "mtmegatron/patches/__init__.py", "mtmegatron/patches/base.py",
                     "mtmegatron/bridge/cpu_device.py"):
        assert required in names, required
    assert any(n.startswith("mtmegatron/_C") and n.endswith(".so") for n in names), names
    assert not any(n.startswith(("backends/", "patches/")) for n in names)  # only under mtmegatron/
