"""scripts/install.sh adds the `musa` extra (torchada) exactly where torch_musa is installed (dry run: the
commands are printed, nothing is installed; torch_musa is a fake package on PYTHONPATH)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _dry_run(pythonpath: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MTMEGATRON_INSTALL_DRY_RUN"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run(["bash", str(ROOT / "scripts/install.sh")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_musa_extra_is_installed_where_torch_musa_is(tmp_path):
    (tmp_path / "torch_musa").mkdir()
    (tmp_path / "torch_musa/__init__.py").write_text("raise ImportError('the check must not import torch_musa')\n")
    out = _dry_run(str(tmp_path))
    assert "-e .[test,musa]" in out, out
    assert "torch_musa found" in out


def test_no_musa_extra_without_torch_musa():
    out = _dry_run(None)
    assert "-e .[test]" in out and "musa]" not in out, out
