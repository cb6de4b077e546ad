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
import types
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
           "scripts/device_check.py", "benchmarks/step.py", "benchmarks/step_baselines.py",
           "benchmarks/peer_megatron_lm.py", "benchmarks/peer_torchtitan.py", "benchmarks/profile_step.py",
           "scripts/megatron_lm_host.py", "tests/conformance", "tests/conftest.py", "tests/helpers"]
LOCAL = {"mtmegatron", "helpers", "step_baselines", "conftest", "step", "peer_megatron_lm", "peer_torchtitan",
         "megatron_lm_host"}


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
    assert all(row["why"] and row["source"] in ("bundle", "image", "musa", "absent", "peer", "git")
               for row in manifest)
    bundle = [r for r in manifest if r["source"] == "bundle"]
    assert [(r["name"], r["module"]) for r in bundle] == [("megatron-core", "megatron")]
    # the pin lies in pyproject's range, and the bundle script downloads exactly the manifest's bundle rows
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"megatron-core>=0.16,<0.17"' in pyproject and bundle[0]["version"].startswith("0.16.")
    listing = subprocess.run(["bash", str(ROOT / "scripts/device_bundle.sh"), "--list"], capture_output=True,
                             text=True, timeout=30)
    assert listing.returncode == 0, listing.stderr
    peers = [r for r in manifest if r["source"] == "peer"]
    assert listing.stdout.split() == [f"{r['name']}=={r['version']}" for r in bundle + peers] + [
        "megatron-lm@core_v0.16.1"]
    assert {r["module"] for r in peers} >= {"torchtitan", "spmd_types", "tyro"}
    # the Megatron-LM tag the bundle extracts is the one the shared launcher runs (and megatron-core's version)
    host = _load("megatron_lm_host", "scripts/megatron_lm_host.py")
    assert host.TAG == "core_v" + bundle[0]["version"]


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
    assert "--peers megatron-lm,torchtitan" in step
    profile = _commands(plan, "profile")[0]
    assert "benchmarks/profile_step.py --backend cpu --out /tmp/unused-report" in profile and "--cpu-size tiny" in profile
    assert all(c.startswith(venv_py) for s in plan["sections"][1:] for c in s["commands"])
    assert plan["boxes_total_s"] <= plan["budget_s"]
    assert {"profile.md", "profile.json", "profile_trace.json.gz", "step.log"} <= set(plan["report_files"])


def test_cpu_dry_run_from_a_venv_sees_that_venvs_packages(tmp_path):
    """--system-site-packages from a venv interpreter shows its base interpreter's packages, not the venv's (where
    a developer's torch lies): the dry run's venv must see what the running venv holds."""
    parent = tmp_path / "parent"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(parent)], check=True, timeout=120)
    parent_py = str(parent / "bin/python")
    info = dc.interpreter(parent_py)
    assert info["venv"] and info["base"] != parent_py and len(info["site"]) == 1
    (Path(info["site"][0]) / "mtm_only_in_parent_venv.py").write_text("WHERE = 'parent venv'\n")
    (tmp_path / "hooked").mkdir()  # what a .pth of the parent venv adds (an editable install, say)
    (tmp_path / "hooked/mtm_via_parent_pth.py").write_text("")
    (Path(info["site"][0]) / "hooked.pth").write_text(str(tmp_path / "hooked") + "\n")
    commands = dc.dry_run_venv(parent_py, info, tmp_path / "dry")
    assert commands[0][:4] == [info["base"], "-m", "venv", "--clear"]
    commands[0].insert(4, "--without-pip")  # pip plays no part in what the venv sees (and costs seconds)
    for command in commands:
        subprocess.run(command, check=True, timeout=120, capture_output=True)
    seen = subprocess.run([str(tmp_path / "dry/bin/python"), "-c", "import mtm_only_in_parent_venv as m, torch, "
                           "mtm_via_parent_pth; print(m.WHERE, m.__file__)"], capture_output=True, text=True,
                          timeout=120)
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
    assert "--peers megatron-lm,torchtitan" in step
    # the profile of the representative dense row: the full run only
    assert [s["name"] for s in plan["sections"]] == [n for n in dc.SECTIONS if n != "profile" or not quick]
    # every box plus its SIGKILL grace fits the budget: 8 minutes of the 15-minute window, 4 with --quick
    assert plan["budget_s"] == (240 if quick else 480)
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
    rows = step.rows_to_run("cuda", ["local", "mtmegatron"], fp8=True, quick=False,
                            peers=("megatron-lm", "torchtitan"), torchao=True)
    assert [name for name, _, _ in rows] == [
        "local, fusions on", "mtmegatron, fusions on",
        "Megatron-LM pretrain_gpt.py, local", "torchtitan Llama-3 train step",
        "mtmegatron, fusions on, FP8 tensorwise scaled_mm",
        "plain PyTorch loop, compiled layers, bf16", "plain PyTorch loop, compiled layers, torchao float8 tensorwise",
        "plain PyTorch loop, compiled layers, torchao float8 rowwise",
        "local, MoE grouped GEMM", "mtmegatron, MoE grouped GEMM",
        "Megatron-LM pretrain_gpt.py, local, MoE sequential experts",
        "local, fusions on, FP8 tensorwise scaled_mm", "local, fusions off", "mtmegatron, fusions off",
        "local, MoE sequential experts", "mtmegatron, MoE sequential experts"]
    assert [extra for _, model, extra in rows if extra[0].startswith("@")] == [
        ["@megatron-lm"], ["@torchtitan"], ["@plain", "bf16"], ["@plain", "tensorwise"], ["@plain", "rowwise"],
        ["@megatron-lm"]]
    assert "plain PyTorch loop, compiled layers, bf16" not in [n for n, _, _ in step.rows_to_run(
        "cuda", ["local", "mtmegatron"], fp8=True, quick=False, torchao=False)]
    fp8 = rows[4][2]
    assert fp8[fp8.index("--fp8-recipe") + 1] == "tensorwise" and fp8[fp8.index("--fp8-executor") + 1] == "scaled_mm"
    cpu = step.rows_to_run("cpu", ["local", "mtmegatron"], fp8=True, quick=True, peers=("megatron-lm", "torchtitan"),
                           torchao=True)
    assert [name for name, _, flags in cpu if "--bf16" in flags] == [
        "local, fusions on, bf16", "local, fusions on, FP8 tensorwise scaled_mm"]
    assert [name for name, _, _ in cpu if name.startswith(("torchtitan", "plain", "Megatron"))] == [
        "Megatron-LM pretrain_gpt.py, local", "Megatron-LM pretrain_gpt.py, local, MoE sequential experts"]
    # the representative shapes: 8 micro-batches and the distributed optimizer on a GPU, 2 on the cpu; --quick
    # keeps the first GPU runs' shapes (one micro-batch)
    gpu = step.GPU_MODELS["dense"]
    assert gpu[gpu.index("--global-batch-size") + 1] == "8" and "--use-distributed-optimizer" in gpu
    quick = step.GPU_QUICK_MODELS["dense"]
    assert quick[quick.index("--global-batch-size") + 1] == "1" and "--use-distributed-optimizer" not in quick
    tiny = step.model_flags("cpu", "tiny", False, "auto", "auto")["dense"]
    assert tiny[tiny.index("--global-batch-size") + 1] == "4" and tiny.count("--global-batch-size") == 1
    assert [step.layers_that_fit("dense", gib) for gib in (79.2, 139.8, 40.0)] == [8, 8, 1]
    assert [step.layers_that_fit("moe", gib) for gib in (79.2, 139.8)] == [2, 2]


def test_megatron_lm_flags_describe_the_same_model():
    peer = _load("peer_megatron_lm", "benchmarks/peer_megatron_lm.py")
    # the fields of a parsed tiny Mixtral row (mtmegatron.config.arguments names; parsing itself costs ~20 s here,
    # the dry run's Megatron-LM rows parse for real)
    args = types.SimpleNamespace(
        num_layers=2, hidden_size=64, ffn_hidden_size=192, num_attention_heads=4, num_query_groups=2, kv_channels=16,
        seq_length=64, max_position_embeddings=64, position_embedding_type="rope", rotary_base=1000000.0,
        normalization="RMSNorm", layernorm_epsilon=1e-5, padded_vocab_size=1024, micro_batch_size=2,
        global_batch_size=4, lr=1e-4, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8,
        clip_grad=1.0, init_method_std=0.02, seed=1234, swiglu=True, untie_embeddings_and_output_weights=True,
        add_bias_linear=False, bf16=False, use_distributed_optimizer=True, num_experts=4, moe_router_topk=2,
        moe_ffn_hidden_size=192, moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.01,
        moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False)
    mlm = peer.megatron_lm_flags(args, "cpu", 3)

    def value(name):
        return mlm[mlm.index(name) + 1]

    assert (value("--hidden-size"), value("--ffn-hidden-size"), value("--num-attention-heads"),
            value("--num-query-groups"), value("--seq-length"), value("--rotary-base")) == (
        "64", "192", "4", "2", "64", "1000000")
    # NullTokenizer's vocabulary is --vocab-size + 1; divisible-by 1 keeps it: the padded vocabulary is ours
    assert value("--vocab-size") == "1023" and value("--make-vocab-size-divisible-by") == "1"
    assert (value("--micro-batch-size"), value("--global-batch-size"), value("--train-iters")) == ("2", "4", "3")
    assert {"--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--group-query-attention",
            "--use-distributed-optimizer", "--no-rope-fusion"} <= set(mlm) and "--bf16" not in mlm
    assert (value("--num-experts"), value("--moe-router-topk"), value("--transformer-impl")) == ("4", "2", "local")
    assert "--moe-grouped-gemm" not in mlm and value("--distributed-backend") == "gloo"
    on_gpu = peer.megatron_lm_flags(types.SimpleNamespace(**{**vars(args), "bf16": True}), "cuda", 3)
    assert "--bf16" in on_gpu and "--no-rope-fusion" not in on_gpu  # Megatron-LM's own fusions on a GPU
    assert on_gpu[on_gpu.index("--distributed-backend") + 1] == "nccl"


def _trace_event(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 1, "tid": tid, "args": args}


def test_profile_phases_and_top_kernels():
    prof = _load("profile_step", "benchmarks/profile_step.py")
    py = "megatron/core/pipeline_parallel/schedules.py"
    cpu = {"traceEvents": [
        _trace_event("ProfilerStep#3", 0, 100, "user_annotation"),
        _trace_event(f"{py}(400): forward_step", 0, 30, "python_function"),
        _trace_event("aten::mm", 5, 20), _trace_event("aten::add", 10, 5),  # nested: mm's self time 15
        _trace_event(f"{py}(500): backward_step", 30, 40, "python_function"),
        _trace_event("aten::mm", 35, 30),
        _trace_event("megatron/core/optimizer/optimizer.py(700): step", 75, 20, "python_function"),
        _trace_event("aten::_foreach_add_", 76, 10),
        _trace_event("gloo:all_reduce", 90, 4),
    ]}
    r = prof.analyze(cpu)
    assert r["kind"] == "cpu ops (self time)" and r["steps"] == 1 and r["wall_ms"] == 0.1
    ms = {k: round(v * 1000) for k, v in r["phases_ms"].items()}
    assert ms == {"forward": 20, "backward": 30, "optimizer": 10, "communication": 4, "other": 0, "idle": 36}
    assert [(k["name"], round(k["ms"] * 1000), k["calls"]) for k in r["top"][:2]] == [("aten::mm", 45, 2),
                                                                                      ("aten::_foreach_add_", 10, 1)]
    assert abs(sum(k["share_pct"] for k in r["top"]) - 100) < 1e-9
    # a GPU trace: kernels take the phase of their launch (the runtime call with the same correlation id)
    gpu = {"traceEvents": [
        _trace_event("ProfilerStep#3", 0, 100, "user_annotation"),
        _trace_event(f"{py}(400): forward_step", 0, 30, "python_function"),
        _trace_event("autograd::engine::evaluate_function: MmBackward0", 40, 20, tid=2),
        _trace_event("cudaLaunchKernel", 10, 1, "cuda_runtime", correlation=1),
        _trace_event("cudaLaunchKernel", 45, 1, "cuda_runtime", correlation=2),
        _trace_event("sm90_xmma_gemm_bf16", 20, 30, "kernel", tid=7, correlation=1),  # runs after forward_step ends
        _trace_event("sm90_xmma_gemm_bf16", 60, 20, "kernel", tid=7, correlation=2),
        _trace_event("ncclDevKernel_AllReduce", 85, 5, "kernel", tid=7),
        _trace_event("cuLaunchKernel", 50, 1, "cuda_driver", correlation=3),  # a Triton kernel's launch
        _trace_event("triton_poi_fused_mul_silu", 62, 4, "kernel", tid=8, correlation=3),
    ]}
    r = prof.analyze(gpu)
    ms = {k: round(v * 1000) for k, v in r["phases_ms"].items()}
    assert ms == {"forward": 30, "backward": 24, "optimizer": 0, "communication": 5, "other": 0, "idle": 45}
    assert r["top"][0]["name"] == "sm90_xmma_gemm_bf16" and r["top"][0]["calls"] == 2
    with pytest.raises(ValueError, match="no ProfilerStep"):
        prof.analyze({"traceEvents": []})


def test_report_shows_the_peer_rows_and_the_profile(tmp_path):
    plan = _plan_in(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out/profile.md").write_text("| phase | ms | share of wall |\n| forward | 1.0 | 10.0% |\n")
    row = {"model": "dense", "ms": 10.0, "tflops": 1.0, "mfu_datasheet_pct": None, "mfu_matmul_pct": 5.0,
           "vs_plain": 1.1, "vs_bound": 2.0, "fusions": "none (cpu)", "peak_gib": 0.5}
    step_fig = {"device": "cpu", "matmul": {"n": 8, "dtype": "float32", "tflops": 1.0}, "iters": 2, "warmup": 1,
                "megatron_lm_source": "git archive core_v0.16.1",
                "models": {"dense": {"layers": 2, "micro_batches": 2, "flop_shares": {"output_layer": 0.25},
                                     "flags": ["--model", "llama3"]}},
                "rows": [{**row, "row": "Megatron-LM pretrain_gpt.py, local"},
                         {"row": "torchtitan Llama-3 train step", "model": "dense", "skipped": "FlexAttention: no"},
                         {"row": "local, fusions on", "model": "dense", "error": "boom"}]}
    results = [{"name": "step", "status": "PASS", "seconds": 1, "box_s": 2, "log": "step.log", "tail": "",
                "figures": step_fig, "summary": dc.summarize("step", step_fig)},
               {"name": "profile", "status": "PASS", "seconds": 1, "box_s": 2, "log": "profile.log", "tail": "",
                "figures": {"top": [1], "trace": "profile_trace.json.gz", "steps": 2, "wall_ms": 10.0,
                            "phases_pct": {"forward": 10.0, "idle": 90.0}}, "summary": ""}]
    md = dc.render_report(plan, results, 3.0)
    assert "| Megatron-LM pretrain_gpt.py, local | dense | 10.0 | 1 | n/a | 5.0% | 1.10 | 2.00 | 0.50 | none (cpu) |" in md
    assert "| torchtitan Llama-3 train step | dense | not run: FlexAttention: no |" in md
    assert "| local, fusions on | dense | failed: boom |" in md
    assert dc.summarize("step", step_fig).startswith("1 rows (1 failed, 1 not run)")
    assert "2 layers, 2 micro-batches a step, output layer 25%" in md and "Megatron-LM from git archive" in md
    assert "| forward | 1.0 | 10.0% |" in md and "trace: profile_trace.json.gz" in md
    assert dc.summarize("profile", results[1]["figures"]) == "2 steps, wall 10.0 ms: forward 10%, idle 90%"


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


def test_a_peer_out_of_memory_is_measured_at_half_the_layers(monkeypatch, tmp_path, capsys):
    """Megatron-LM's local attention keeps the s x s scores: where it does not fit at our size, its row runs at half
    the layers, with that size's FLOPs and no ratio to the full-size plain loop or bound (all stubbed: no process)."""
    step = _load("step_benchmark", "benchmarks/step.py")
    peer = sys.modules["peer_megatron_lm"]
    layers_of = lambda flags: int(flags[flags.index("--num-layers") + 1])  # noqa: E731
    monkeypatch.setattr(step, "parse", lambda flags: types.SimpleNamespace(num_layers=layers_of(flags), micro_batch_size=1,
                                                                         global_batch_size=8))
    monkeypatch.setattr(step, "model_tflop", lambda flags: 10.0 * layers_of(flags))
    monkeypatch.setattr(step, "flop_shares", lambda args: {"layers": 1.0, "output_layer": 0.0})
    monkeypatch.setattr(step, "plain_step_ms", lambda *a, **k: (100.0, None))
    monkeypatch.setattr(step, "bound_step_ms", lambda *a, **k: 50.0)
    monkeypatch.setattr(step, "release", lambda backend: None)  # (importing dynamo to reset it: seconds)
    monkeypatch.setattr(step, "run_ours", lambda flags, *a: {"ms": 80.0, "fusions": "x", "peak_gib": None})
    monkeypatch.setattr(peer, "find_source", lambda given: ("/mlm", "here"))
    monkeypatch.setattr(peer, "megatron_lm_flags", lambda args, backend, iters: ["--num-layers", str(args.num_layers)])
    tried = []

    def megatron_lm(mlm, backend, flags, warmup, threads):
        tried.append(layers_of(flags))
        return ({"error": "torch.OutOfMemoryError: CUDA out of memory"} if layers_of(flags) > 2 else
                {"ms": 40.0, "peak_gib": 70.0, "fusions": "Megatron-LM defaults"})

    monkeypatch.setattr(peer, "run", megatron_lm)
    monkeypatch.setattr(step, "model_flags", lambda *a: {"dense": ["--num-layers", "4"], "moe": ["--num-layers", "2"]})
    rc = step.main(["--impls", "mtmegatron", "--peers", "megatron-lm", "--fp8", "off", "--matmul-size", "0",
                    "--json", str(tmp_path / "step.json")])
    rows = {r["row"]: r for r in json.loads((tmp_path / "step.json").read_text())["rows"]}
    assert rc == 1 and tried == [4, 2, 2]  # dense: 4 layers out of memory, then 2; the 2-layer MoE row fits
    half = rows["Megatron-LM pretrain_gpt.py, local, 2 layers (out of memory at 4)"]
    assert half["tflops"] == 20.0 / 0.04 and half["vs_plain"] is None and half["vs_bound"] is None
    assert "out of memory" in rows["Megatron-LM pretrain_gpt.py, local, 4 layers"]["error"]
    assert rows["mtmegatron, fusions on"]["vs_bound"] == 80.0 / 50.0 and rows["mtmegatron, fusions on"]["tflops"] == 500
    assert "n/a" in capsys.readouterr().out
