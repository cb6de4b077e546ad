"""scripts/install.sh decides as documented (dry run: decisions and commands are printed, nothing is installed):
the musa extra where torch_musa is installed, and the MUSA kernel build where mcc is there too; a project venv
where the python is PEP 668-managed; a CPU torch from the CPU index with no torch and no GPU, the CUDA build where
nvidia-smi lists a GPU, the pip configuration's index where it names one; CMake through pip when it is too old.
Fakes: torch_musa on PYTHONPATH, nvidia-smi, cmake and mcc on PATH; MTMEGATRON_INSTALL_ASSUME_PEP668 stands in for
a distribution python."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def _dry_run(pythonpath: str | None = None, extra_env: dict | None = None, fake_bin: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHON")
           and not k.startswith(("PIP_", "MTMEGATRON_"))}
    env["MTMEGATRON_INSTALL_DRY_RUN"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if fake_bin:
        env["PATH"] = f"{fake_bin}:{env['PATH']}"
    env.update(extra_env or {})
    proc = subprocess.run(["bash", str(ROOT / "scripts/install.sh")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _fake(tmp_path: Path, name: str, output: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\necho '{output}'\n")
    (bin_dir / name).chmod(0o755)
    return bin_dir


def _pep668(tmp_path: Path, **extra) -> dict:
    return {"MTMEGATRON_INSTALL_ASSUME_PEP668": "1", "MTMEGATRON_VENV": str(tmp_path / "venv"),
            "HOME": str(tmp_path / "home"), **extra}


def test_musa_extra_is_installed_where_torch_musa_is(tmp_path):
    (tmp_path / "torch_musa").mkdir()
    (tmp_path / "torch_musa/__init__.py").write_text("raise ImportError('the check must not import torch_musa')\n")
    out = _dry_run(str(tmp_path))
    assert "-e .[test,musa]" in out, out
    assert "torch_musa found" in out
    assert "-m mtmegatron.ops.musa_build" not in out and "no mcc" in out, out  # no MUSA compiler: no kernel build


def test_this_machine_keeps_its_python_torch_and_tools():
    out = _dry_run()
    assert "-e .[test]" in out and "musa]" not in out, out
    assert "venv" not in out and "torch==" not in out  # not PEP 668-managed; torch is installed: kept
    assert "cmake>=" not in out  # CMake 3.25 here


def test_pep668_python_gets_a_project_venv_and_a_cpu_torch(tmp_path):
    venv = tmp_path / "venv"
    out = _dry_run(extra_env=_pep668(tmp_path))
    assert "managed by the distribution (PEP 668)" in out
    assert f"-m venv {venv}\n" in out
    lines = out.splitlines()
    torch_line = next(line for line in lines if line.startswith("+") and "torch==2.13.0" in line)
    assert torch_line.startswith(f"+ {venv}/bin/python -m pip install") and torch_line.endswith(CPU_INDEX)
    assert f"+ {venv}/bin/python -m pip install --quiet --no-build-isolation -e .[test]" in out
    assert f"source {venv}/bin/activate" in out  # ~/.local/bin is not on PATH here


def test_gpu_gets_the_cuda_torch_and_a_pip_index_is_trusted(tmp_path):
    fake_bin = _fake(tmp_path, "nvidia-smi", "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)")
    out = _dry_run(extra_env=_pep668(tmp_path), fake_bin=fake_bin)
    assert "CUDA build" in out and "torch==2.13.0\n" in out and CPU_INDEX not in out
    out = _dry_run(extra_env=_pep668(tmp_path, PIP_FIND_LINKS="/opt/wheels"))
    assert "the index your pip configuration names" in out and "torch==2.13.0\n" in out and CPU_INDEX not in out


def test_old_cmake_is_replaced_through_pip(tmp_path):
    out = _dry_run(fake_bin=_fake(tmp_path, "cmake", "cmake version 3.22.1"))
    assert "CMake 3.22 (need >= 3.24)" in out and "cmake>=3.24" in out


def _torch_musa_on_path(path: Path) -> str:
    (path / "torch_musa").mkdir(parents=True, exist_ok=True)
    (path / "torch_musa/__init__.py").write_text("raise ImportError('the check must not import torch_musa')\n")
    return str(path)


def test_musa_kernels_are_built_where_mcc_and_torch_musa_are(tmp_path):
    build = "-m mtmegatron.ops.musa_build"
    with_mcc = _dry_run(_torch_musa_on_path(tmp_path), fake_bin=_fake(tmp_path, "mcc", "mcc 4.3"))
    assert build in with_mcc and "building the MUSA kernels" in with_mcc, with_mcc
    assert with_mcc.index("-e .[test,musa]") < with_mcc.index(build)  # after mtmegatron itself is installed


def test_musa_kernel_build_insisted_on_names_what_is_missing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHON")}
    env.update(MTMEGATRON_INSTALL_DRY_RUN="1", MTMEGATRON_BUILD_MUSA="1")
    proc = subprocess.run(["bash", str(ROOT / "scripts/install.sh")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 1 and "MTMEGATRON_BUILD_MUSA=1 but torch_musa is missing" in proc.stderr, proc.stderr
