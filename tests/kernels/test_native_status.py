"""Native kernel loading is never silent: a failed `mtmegatron._C` or MUSA-extension import is kept, shown by
`native.status()` (the line `mtmegatron env` and the pretrain start-up print) and, on a MUSA process, warned;
the MUSA extension is built into the installed package, not into the repository root."""
from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest

from mtmegatron.ops import musa_build, native

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(monkeypatch):
    """native's module state, restored after the test."""
    for name in ("NATIVE_LOADED", "LOAD_ERROR", "BUILD_INFO", "MUSA_LOADED", "MUSA_LOAD_ERROR"):
        monkeypatch.setattr(native, name, getattr(native, name))
    return monkeypatch


def _failing_import(monkeypatch, fail_for: str, exc: ImportError):
    real = importlib.import_module

    def import_module(name, *a, **kw):
        if name == fail_for:
            raise exc
        return real(name, *a, **kw)

    monkeypatch.setattr(native.importlib, "import_module", import_module)


def test_failed_C_import_is_reported_in_status(fresh):
    fresh.setattr(native, "NATIVE_LOADED", False)
    _failing_import(fresh, "mtmegatron._C", ImportError("_C.so: undefined symbol: _ZN3c104cuda9SetDevice"))
    assert native.load() is False
    assert native.LOAD_ERROR == "ImportError: _C.so: undefined symbol: _ZN3c104cuda9SetDevice"
    fresh.setattr(native, "native_available", lambda device, op=None: False)  # as if _C never registered
    line = native.status("cpu")
    assert line.startswith("native kernels on cpu: no, fused ops run their Python reference")
    assert "mtmegatron._C failed to load: ImportError: _C.so: undefined symbol" in line


def test_loaded_C_is_reported_as_native():
    assert native.NATIVE_LOADED, native.LOAD_ERROR
    assert native.status("cpu") == "native kernels on cpu: yes (mtmegatron._C)"


def test_musa_extension_failure_warns_on_a_musa_process(fresh):
    fresh.setattr(native, "MUSA_LOADED", False)
    fresh.setattr(native, "_musa_is_registered", lambda: True)
    _failing_import(fresh, native.MUSA_EXTENSION, ImportError("libmusart.so.2: cannot open shared object file"))
    with pytest.warns(UserWarning, match=r"MUSA fused ops run their Python reference: mtmegatron._musa_kernels "
                                         r"failed to import: ImportError: libmusart.so.2: cannot open"):
        assert native.load_musa_extension() is False
    with pytest.warns(UserWarning, match="libmusart"):  # status() retries (torch_musa may load after ops)
        line = native.status("musa")
    assert "fused ops run their Python reference" in line and "libmusart.so.2" in line, line


def test_musa_extension_not_built_is_named_with_the_fix(fresh):
    fresh.setattr(native, "MUSA_LOADED", False)
    fresh.setattr(native, "_musa_is_registered", lambda: False)
    missing = ModuleNotFoundError(f"No module named '{native.MUSA_EXTENSION}'", name=native.MUSA_EXTENSION)
    _failing_import(fresh, native.MUSA_EXTENSION, missing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a MUSA process: recorded, not warned
        assert native.load_musa_extension() is False
    assert native.MUSA_LOAD_ERROR == "mtmegatron._musa_kernels is not built (run: python -m mtmegatron.ops.musa_build)"
    assert native.MUSA_LOAD_ERROR in native.status("musa")


def test_musa_extension_missing_dependency_is_not_mistaken_for_not_built(fresh):
    fresh.setattr(native, "MUSA_LOADED", False)
    fresh.setattr(native, "_musa_is_registered", lambda: False)
    _failing_import(fresh, native.MUSA_EXTENSION, ModuleNotFoundError("No module named 'torch_musa'", name="torch_musa"))
    native.load_musa_extension()
    assert native.MUSA_LOAD_ERROR.startswith("mtmegatron._musa_kernels failed to import: ModuleNotFoundError")


def test_musa_extension_is_built_into_the_package_not_the_repo_root(tmp_path):
    target = musa_build.package_dir()
    assert (target / "_C").exists() or any(target.glob("_C.*")), f"{target} is not where mtmegatron._C lives"
    assert target != REPO
    args = musa_build.build_args(str(tmp_path))
    assert "--inplace" not in args
    assert args[args.index("--build-lib") + 1] == str(target.parent)  # mtmegatron._musa_kernels -> target/
    assert musa_build.EXTENSION_NAME == native.MUSA_EXTENSION == "mtmegatron._musa_kernels"
