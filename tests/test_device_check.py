"""The GPU lane's preparation, checked without a GPU and without downloading: scripts/device_manifest.txt lists
every third-party module the runtime and the lane import (and the bundle script reads the same list);
scripts/device_check.py's plans (the CPU dry run's fresh venv, pip index off, megatron-core from the bundle; the
device's arch-only build and sections) and its time boxes (a failing or hanging section hides none of the
others); scripts/gpu_train_check.py's comparison, reporting and one real cpu-vs-cpu run; benchmarks/step.py's row
order. The full dry run (`scripts/device_check.sh --cpu-dry-run`) is too slow for CI; docs/device_runs.md holds
its report."""
from __future__ import annotations

import ast
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


dc = _load("device_check", "scripts/device_check.py")
gtc = _load("gpu_train_check", "scripts/gpu_train_check.py")


# ---- the bundle manifest -----------------------------------------------------------------------------------------
RUNTIME = ["mtmegatron", "scripts/gpu_train_check.py", "scripts/gpu_kernels.py",
           "scripts/device_check.py", "benchmarks/step.py", "benchmarks/step_baselines.py", "tests/conformance",
           "tests/conftest.py", "tests/helpers"]
LOCAL = {"mtmegatron", "helpers", "step_baselines", "conftest"}


def _third_party_imports() -> dict[str, str]:
    """Top-level module -> one file importing it, over what the device runs."""
    found = {}
    files = [p for entry in RUNTIME for p in ((ROOT / entry).rglob("*.py") if (ROOT / entry).is_dir()
                                              else [ROOT / entry])]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in LOCAL:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_manifest_names_every_module_the_device_imports():
    manifest = dc.read_manifest()
    listed = {row["module"] for row in manifest}
    missing = {m: f for m, f in _third_party_imports().items() if m not in listed}
    assert not missing, f"add to scripts/device_manifest.txt (and the bundle if the device image lacks it): {missing}"
    assert all(row["why"] and row["source"] in ("bundle", "image", "musa", "absent") for row in manifest)
    bundle = [r for r in manifest if r["source"] == "bundle"]
    assert [(r["name"], r["module"]) for r in bundle] == [("megatron-core", "megatron")]
    # the pin lies in pyproject's range, and the bundle script downloads exactly the manifest's bundle rows
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"megatron-core>=0.16,<0.17"' in pyproject and bundle[0]["version"].startswith("0.16.")
    listing = subprocess.run(["bash", str(ROOT / "scripts/device_bundle.sh"), "--list"], capture_output=True,
                             text=True, timeout=30)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.split() == [f"{r['name']}=={r['version']}" for r in bundle]


def test_wheel_folder_is_checked_against_the_manifest(tmp_path):
    manifest = dc.read_manifest()
    good = "megatron_core-0.16.1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
    assert dc.check_wheels(tmp_path, manifest) == [
        f"megatron-core==0.16.1: no wheel in {tmp_path} (run scripts/device_bundle.sh)"]
    (tmp_path / good).touch()
    assert dc.check_wheels(tmp_path, manifest) == []
    (tmp_path / "einops-0.8.1-py3-none-any.whl").touch()
    assert dc.check_wheels(tmp_path, manifest) == ["einops-0.8.1-py3-none-any.whl: not in scripts/device_manifest.txt"]
    (tmp_path / "einops-0.8.1-py3-none-any.whl").unlink()
    (tmp_path / good.replace("0.16.1", "0.16.0")).touch()
    assert "2 wheels" in dc.check_wheels(tmp_path, manifest)[0]
    (tmp_path / good).unlink()
    assert dc.check_wheels(tmp_path, manifest) == [f"megatron-core: {good.replace('0.16.1', '0.16.0')} is not "
                                                   "version 0.16.1"]


# ---- the plans -----------------------------------------------------------------------------------------------------
def _plan(capsys, *argv) -> dict:
    assert dc.main(["--print-plan", "--out", "/tmp/unused-report", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def _commands(plan: dict, section: str) -> list[str]:
    return next(s for s in plan["sections"] if s["name"] == section)["commands"]


def test_cpu_dry_run_plan(capsys):
    plan = _plan(capsys, "--cpu-dry-run")
    assert [s["name"] for s in plan["sections"]] == list(dc.SECTIONS)
    assert plan["backend"] == "cpu" and plan["mode"] == "cpu-dry-run" and plan["wheels"].endswith(".device/host")
    venv_py, site = plan["python"], plan["site"]
    install = _commands(plan, "install")
    assert "-m venv --clear --system-site-packages" in install[0] and venv_py.startswith(plan["venv"])
    if sys.prefix != sys.base_prefix:  # run from a venv: that venv's site-packages join the new one's path
        assert "_mtm_parent_venv.pth" in install.pop(1)
    assert f"{venv_py} -m pip install --no-index --no-deps" in install[1] and f"--target {site}" in install[1]
    assert "megatron.core.__file__" in install[2] and site in install[2]  # asserts it does not come from the system
    assert plan["env"]["PIP_NO_INDEX"] == "1" and plan["env"]["PIP_CONFIG_FILE"] == "/dev/null"
    assert plan["env"]["PYTHONPATH"] == site
    build = _commands(plan, "build")
    assert build[0].startswith(f"{venv_py} -m pip install --no-index --no-build-isolation --no-deps -e ")
    assert next(s for s in plan["sections"] if s["name"] == "build")["env"] == {"MTMEGATRON_BUILD_CUDA": "0"}
    assert "-k cpu" in _commands(plan, "conformance")[0]
    train = _commands(plan, "train_check")[0]
    assert "--backend-under-test cpu" in train and "--fp8-executors emulated" in train  # cpu scaled_mm: minutes
    assert "--skip-kernels" in train  # GPU-sized kernel shapes: minutes on cpu
    step = _commands(plan, "step")[0]
    assert "--backend cpu" in step and "--impls local,mtmegatron" in step and "--fp8 on" in step
    assert "--cpu-size tiny" in step  # where the scaled_mm FP8 row runs in seconds
    assert all(c.startswith(venv_py) for s in plan["sections"][1:] for c in s["commands"])
    assert plan["boxes_total_s"] <= plan["budget_s"] and len(plan["report_files"]) <= 8


def test_cpu_dry_run_from_a_venv_sees_that_venvs_packages(tmp_path):
    """--system-site-packages from a venv interpreter shows its base interpreter's packages, not the venv's (where
    a developer's torch lies): the dry run's venv must see what the running venv holds."""
    parent = tmp_path / "parent"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(parent)], check=True, timeout=120)
    parent_py = str(parent / "bin/python")
    info = dc.interpreter(parent_py)
    assert info["venv"] and info["base"] != parent_py and len(info["site"]) == 1
    (Path(info["site"][0]) / "mtm_only_in_parent_venv.py").write_text("WHERE = 'parent venv'\n")
    commands = dc.dry_run_venv(parent_py, info, tmp_path / "dry")
    assert commands[0][:4] == [info["base"], "-m", "venv", "--clear"]
    commands[0].insert(4, "--without-pip")  # pip plays no part in what the venv sees (and costs seconds)
    for command in commands:
        subprocess.run(command, check=True, timeout=120, capture_output=True)
    seen = subprocess.run([str(tmp_path / "dry/bin/python"), "-c", "import mtm_only_in_parent_venv as m, torch; "
                           "print(m.WHERE, m.__file__)"], capture_output=True, text=True, timeout=120)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split()[:2] == ["parent", "venv"] and info["site"][0] in seen.stdout


@pytest.mark.parametrize("quick", [False, True])
def test_device_plan_builds_for_the_device_arch_and_fits_its_time(capsys, quick):
    plan = _plan(capsys, "--backend", "cuda", "--arch", "9.0", *(["--quick"] if quick else []))
    assert plan["venv"] is None and plan["wheels"].endswith(".device/wheels")
    build = next(s for s in plan["sections"] if s["name"] == "build")
    build_env = {k: v for k, v in build["env"].items() if k != "CUDACXX"}  # CUDACXX: where nvcc is off PATH
    assert build_env == {"TORCH_CUDA_ARCH_LIST": "9.0", "CMAKE_ARGS": "-DCMAKE_CUDA_ARCHITECTURES=90",
                         "MTMEGATRON_BUILD_CUDA": "1"}
    assert plan["env"]["CMAKE_BUILD_PARALLEL_LEVEL"] == str(plan["cores"])
    assert "-m gpu" in _commands(plan, "conformance")[0]
    train = _commands(plan, "train_check")[0]
    assert "--backend-under-test cuda" in train and "--fp8-executors" not in train  # every executor that imports
    assert "--skip-kernels" not in train
    step = _commands(plan, "step")[0]
    assert "--backend cuda" in step and "--fp8 on" in step and ("--quick" in step) == quick
    # every box plus its SIGKILL grace fits the budget: 9 minutes, 4 with --quick
    assert plan["budget_s"] == (240 if quick else 540)
    assert plan["boxes_total_s"] + dc.KILL_AFTER_S * len(plan["sections"]) <= plan["budget_s"] + 30


def test_user_mistakes_exit_2(capsys):
    assert dc.main(["--cpu-dry-run", "--quick", "--print-plan"]) == 2
    assert dc.main(["--cpu-dry-run", "--backend", "cuda", "--print-plan"]) == 2


def _plan_in(tmp_path):
    """A quick cpu plan whose wheel folder, work and site folders are under ``tmp_path`` (its sections replaced)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "megatron_core-0.16.1-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    plan = dc.make_plan("quick", "cpu", None, "test", tmp_path / "out", sys.executable, 1)
    plan.wheels, plan.work, plan.site = str(wheels), str(tmp_path / "work"), str(tmp_path / "site")
    return plan


def test_a_failing_or_hanging_section_hides_none_of_the_others(tmp_path):
    plan = _plan_in(tmp_path)
    py = sys.executable
    plan.sections = [
        dc.Section("install", 2, [[py, "-c", "print('megatron.core 0.16.1 from /x/megatron/core/__init__.py')"]]),
        dc.Section("build", 1, [[py, "-c", "import time; time.sleep(30)"]], needs=("install",)),
        dc.Section("conformance", 20, [[py, "-c", "import sys; print('1 failed, 2 passed in 0.5s'); sys.exit(1)"]]),
        dc.Section("train_check", 20, [[py, "-c", "print('fine')"]], needs=("build",)),
        dc.Section("step", 20, [[py, "-c", "print('fine')"]]),
    ]
    assert dc.execute(plan) == 1
    report = json.loads((tmp_path / "out/device_report.json").read_text())
    status = {s["name"]: s["status"] for s in report["sections"]}
    assert status == {"install": "PASS", "build": "TIMEOUT", "conformance": "FAIL", "train_check": "SKIPPED",
                      "step": "PASS"}
    build = report["sections"][1]
    assert 1 < build["box_s"] <= 3 and build["seconds"] < 10  # killed at its box, not after the 30 s sleep
    assert report["sections"][0]["figures"]["megatron_core"] == "0.16.1"
    assert report["sections"][2]["figures"] == {"failed": 1, "passed": 2, "pytest_s": 0.5}
    md = (tmp_path / "out/device_report.md").read_text()
    assert re.search(r"\| build \| TIMEOUT \| \d+ \| \d+ \|", md) and "| step | PASS |" in md
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        ["device_report.md", "device_report.json", "install.log", "build.log", "conformance.log",
         "train_check.log", "step.log"])


# ---- scripts/gpu_train_check.py ----------------------------------------------------------------------------------
def _metrics(path: Path, losses):
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"iteration": i + 1, "loss": x, "grad_norm": 1.0} for i, x in enumerate(losses)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))


def test_read_losses_orders_by_iteration_and_rejects_missing(tmp_path):
    _metrics(tmp_path, [3.0, 2.0, 1.0])
    assert gtc.read_losses(tmp_path) == [3.0, 2.0, 1.0]
    with pytest.raises(ValueError, match="no metrics.jsonl"):
        gtc.read_losses(tmp_path / "nothing")


def test_loss_falls_and_close():
    assert gtc.loss_falls([10.0, 9.0, 8.0, 7.5])[0]
    assert not gtc.loss_falls([10.0, 10.5, 11.0])[0]
    assert not gtc.loss_falls([10.0, math.nan, 8.0])[0]
    assert not gtc.loss_falls([10.0])[0]
    assert gtc.close(10.0, 10.000005, 1e-5)[0] and not gtc.close(10.0, 10.00002, 1e-5)[0]
    assert gtc.close(10.2, 10.0, 0.05, relative=True)[0] and not gtc.close(11.0, 10.0, 0.05, relative=True)[0]
    assert not gtc.close(math.nan, 1.0, 1.0)[0]


def test_parse_kernel_table():
    out = ("device=cuda native=True build={}\n| op | max abs err vs CPU reference | ours ms | eager ms | eager/ours |\n"
           "|---|---|---|---|---|\n| rms_norm | 2.4e-07 | 0.1 | 0.2 | 2.00x |\n| swiglu | 0.5 | 0.1 | 0.1 | 1.0x |\n")
    assert gtc.parse_kernel_table(out) == (True, {"rms_norm": 2.4e-07, "swiglu": 0.5})


def test_a_mismatch_fails_the_run(monkeypatch, tmp_path, capsys):
    runs = {"cuda": [10.0, 9.0, 8.0], "cpu": [10.1]}
    monkeypatch.setattr(gtc, "run_pretrain", lambda cmd, log_dir, timeout=600: (runs[cmd[cmd.index("--backend") + 1]], ""))
    monkeypatch.setattr(gtc, "device_count", lambda backend: 1)
    rc = gtc.main(["--backend-under-test", "cuda", "--models", "llama3", "--dtypes", "fp32", "--skip-kernels",
                   "--skip-fp8", "--work-dir", str(tmp_path), "--jobs", "2"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "| PASS   | first 10.00000 -> last 8.50000 |" in out
    assert "FAIL" in out and "diff 1.00e-01 (tol 1e-05)" in out
    assert "2-rank TP2 runs" in out and "SKIP" in out


def test_cpu_vs_cpu_run_passes(tmp_path, capsys):
    rc = gtc.main(["--backend-under-test", "cpu", "--models", "llama3", "--dtypes", "fp32", "--train-iters", "2",
                   "--tp2", "off", "--skip-kernels", "--skip-fp8", "--work-dir", str(tmp_path), "--jobs", "2",
                   "--json", str(tmp_path / "check.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert re.search(r"\| llama3/fp32 first loss cpu vs cpu\s*\| PASS\s*\| .*diff 0.00e\+00", out), out
    assert gtc.read_losses(tmp_path / "cpu" / "llama3/fp32")[0] > 0
    saved = json.loads((tmp_path / "check.json").read_text())
    assert [r["status"] for r in saved["results"]] == ["PASS", "PASS", "SKIP"]
    assert len(saved["losses"]["bt llama3/fp32"]) == 2 and len(saved["losses"]["ref llama3/fp32"]) == 1


# ---- benchmarks/step.py ------------------------------------------------------------------------------------------
def test_step_rows_put_the_comparisons_first():
    step = _load("step_benchmark", "benchmarks/step.py")  # it puts its own directory on sys.path (step_baselines)
    rows = step.rows_to_run("cuda", ["local", "mtmegatron"], fp8=True, quick=False)
    assert [name for name, _, _ in rows] == [
        "local, fusions on", "mtmegatron, fusions on", "local, fusions off", "mtmegatron, fusions off",
        "local, fusions on, FP8 tensorwise scaled_mm", "mtmegatron, fusions on, FP8 tensorwise scaled_mm",
        "local, MoE sequential experts", "local, MoE grouped GEMM",
        "mtmegatron, MoE sequential experts", "mtmegatron, MoE grouped GEMM"]
    fp8 = rows[4][2]
    assert fp8[fp8.index("--fp8-recipe") + 1] == "tensorwise" and fp8[fp8.index("--fp8-executor") + 1] == "scaled_mm"
    assert "--moe-grouped-gemm" in rows[-1][2] and "--moe-grouped-gemm" not in rows[-2][2]
    cpu = step.rows_to_run("cpu", ["local", "mtmegatron"], fp8=True, quick=True)
    assert [name for name, _, flags in cpu if "--bf16" in flags] == [
        "local, fusions on, bf16", "local, fusions on, FP8 tensorwise scaled_mm"]


def test_a_failed_kernel_build_falls_back_to_one_without_kernels(tmp_path):
    plan = _plan_in(tmp_path)
    py = sys.executable
    fails_with_kernels = "import os, sys; sys.exit(int(os.environ['MTMEGATRON_BUILD_CUDA']))"
    plan.sections = [
        dc.Section("install", 5, [[py, "-c", "print('ok')"]]),
        dc.Section("build", 20, [[py, "-c", fails_with_kernels]], {"MTMEGATRON_BUILD_CUDA": "1"}, ("install",)),
        dc.Section("train_check", 20, [[py, "-c", "print('fine')"]], needs=("build",)),
    ]
    assert dc.execute(plan) == 1  # the kernel build failed: the run says so
    report = json.loads((tmp_path / "out/device_report.json").read_text())
    assert [(s["name"], s["status"]) for s in report["sections"]] == [
        ("install", "PASS"), ("build", "FAIL"), ("build_without_kernels", "PASS"), ("train_check", "PASS")]
    assert (tmp_path / "out/build_without_kernels.log").is_file()
