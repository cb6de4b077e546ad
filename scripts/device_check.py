"""The GPU lane in one offline command (scripts/device_check.sh runs this): on a lent machine with no network it
installs the carried wheels (.device/wheels, from scripts/device_bundle.sh) into a temporary target on PYTHONPATH,
builds mtmegatron with its kernels for this device's architecture only, then runs, each section in its own time
box (coreutils `timeout`, whose process group takes the section's children with it) so that one failure or hang
hides none of the others:

  1. conformance  the `-m gpu` backend conformance tests (tests/conformance, as scripts/gpu_conformance.sh);
  2. train_check  scripts/gpu_train_check.py: tiny Llama-3, Mixtral, DeepSeek-V3 on the device vs the cpu
                  backend (first loss, fp32 and bf16), falling loss, kernels vs CPU reference, FP8 executors;
  3. step         benchmarks/step.py: a Llama-3-8B-shaped model (as many layers as fit, at most 8; 8 micro-batches
                  of 4096 tokens; bf16; distributed optimizer) and Mixtral-8x7B's layers, TFLOP/s, MFU against the
                  datasheet peak and an 8192^3 bf16 matmul of the same run, ratio to the GEMM + attention bound,
                  peak memory: mtmegatron and local vs their peers on the same shapes and device (Megatron-LM
                  core_v0.16.1's own pretrain_gpt.py, torchtitan 0.3's Llama-3 step, a plain PyTorch loop), FP8
                  (mtmegatron's tensorwise scaled_mm; torchao's float8 training on the plain loop) vs bf16,
                  grouped-GEMM vs sequential MoE, fusions off (--quick: the 2026-11-28 shapes, few rows);
  4. profile      benchmarks/profile_step.py: torch.profiler over two steps of the dense row; top 20 kernels,
                  forward / backward / optimizer / communication / idle, the trace gzipped (full and dry run only);

and writes device_report.md, device_report.json (every figure), one log per section, profile.md, profile.json and
profile_trace.json.gz into --out ($OUT when set, else ./device-report). Time: the sections' boxes add up to under
8 minutes (--quick: under 4); what a section leaves unused goes to the next one. The peers come from
.device/peers (scripts/device_bundle.sh: Megatron-LM's trainer, torchtitan and torchao unpacked), carried with
.device/wheels.

The backend is what the machine has: musa where torch_musa imports and mcc is found (UNTRIED: no MUSA machine has
run this; its build step is mtmegatron.ops.musa_build), else cuda where a CUDA device answers. --cpu-dry-run runs
the same flow here with --backend cpu and CPU sizes: a fresh venv (--system-site-packages, for torch and the build
tools this machine has system-wide) with pip's index off (PIP_NO_INDEX=1), megatron-core installed from
.device/host into a --target directory that comes first on PYTHONPATH (checked: megatron.core.__file__ lies under
it, not in the system's site-packages). --print-plan prints the plan (sections, time boxes, backend, arch,
commands, environment) as JSON and runs nothing.

May assume: python3 >= 3.10 (this file imports only the standard library, so it runs before anything is
installed); coreutils `timeout`; the working directory is anything (paths are taken from this file).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "scripts/device_manifest.txt"
SECTIONS = ("install", "build", "conformance", "train_check", "step", "profile")
# seconds per section; each plan's boxes add up to under its budget (full 8 min, quick 4 min on the device: a
# session's window is 15 minutes, the machine's start included). Measured on the first H200 runs (2026-11-28):
# install 15-20 s, build 40 s (kernels for sm90 included), conformance 35 s, train_check 52 s for llama3 alone, 91 s
# for all three models; step: UNMEASURED at the representative shapes (8 layers x 8 micro-batches: estimated ~2 s a
# step, ~20 s a row with its start-up, 8 rows; profile: the same start-up, 4 steps and the export of a trace with
# Python stacks); a box left unused goes to the next. install and conformance keep ~10 s over what was measured
# (a timeout there would cost the whole run's sections that need them). --quick has no profile section.
BOXES = {
    "full": {"install": 30, "build": 60, "conformance": 45, "train_check": 100, "step": 155, "profile": 60},
    "quick": {"install": 25, "build": 55, "conformance": 45, "train_check": 60, "step": 35},
    "cpu-dry-run": {"install": 120, "build": 600, "conformance": 150, "train_check": 360, "step": 600,
                    "profile": 120},
}
BUDGET_S = {"full": 480, "quick": 240, "cpu-dry-run": 2000}
KILL_AFTER_S = 10  # `timeout -k`: SIGKILL this long after the SIGTERM
REPORT_FILES = ("device_report.md", "device_report.json", "install.log", "build.log", "conformance.log",
                "train_check.log", "step.log", "profile.log", "profile.md", "profile.json",
                "profile_trace.json.gz")  # + build_without_kernels.log when the kernel build failed


@dataclass
class Section:
    name: str
    box_s: int
    commands: list[list[str]]
    env: dict[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # sections that must have passed first (else this one is skipped)


@dataclass
class Plan:
    mode: str  # full, quick or cpu-dry-run
    backend: str
    arch: str | None
    device: str
    python: str  # the interpreter every section runs (the venv's in a dry run)
    base_python: str
    venv: str | None
    site: str
    wheels: str
    out: str
    work: str
    cores: int
    budget_s: int
    env: dict[str, str]
    sections: list[Section]


# ---- the bundle manifest -----------------------------------------------------------------------------------------
def read_manifest(path: Path = MANIFEST) -> list[dict]:
    """Rows of scripts/device_manifest.txt: name, module, source, why (version for bundle==VERSION)."""
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, module, source, why = [c.strip() for c in line.split("|", 3)]
        row = {"name": name, "module": module, "source": source, "why": why}
        for kind in ("bundle", "peer", "git"):
            if source.startswith(f"{kind}=="):
                row.update(source=kind, version=source.split("==", 1)[1])
        rows.append(row)
    return rows


def wheel_project(filename: str) -> str:
    """The normalized project name of a wheel file (PEP 427: name-version-...whl, '_' for '-')."""
    return filename.split("-", 1)[0].lower().replace("_", "-")


def check_wheels(wheels: Path, manifest: list[dict]) -> list[str]:
    """Problems with a wheel folder: a bundle package missing, given twice, of another version, or a wheel the
    manifest does not name."""
    found = sorted(p.name for p in wheels.glob("*.whl")) if wheels.is_dir() else []
    problems = []
    for row in (r for r in manifest if r["source"] == "bundle"):
        name = row["name"].lower().replace("_", "-")
        mine = [f for f in found if wheel_project(f) == name]
        if not mine:
            problems.append(f"{row['name']}=={row['version']}: no wheel in {wheels} (run scripts/device_bundle.sh)")
        elif len(mine) > 1:
            problems.append(f"{row['name']}: {len(mine)} wheels in {wheels} ({', '.join(mine)}); keep one")
        elif mine[0].split("-")[1] != row["version"]:
            problems.append(f"{row['name']}: {mine[0]} is not version {row['version']}")
    names = {r["name"].lower().replace("_", "-") for r in manifest if r["source"] == "bundle"}
    problems += [f"{f}: not in scripts/device_manifest.txt" for f in found if wheel_project(f) not in names]
    return problems


# ---- what the machine has ----------------------------------------------------------------------------------------
_PROBE = r"""
import importlib.util, json, shutil, os
out = {"torch": None}
try:
    import torch
    out["torch"] = torch.__version__
    if importlib.util.find_spec("torch_musa") is not None:
        mcc = shutil.which("mcc") or (os.path.join(os.environ["MUSA_HOME"], "bin", "mcc")
                                      if os.environ.get("MUSA_HOME") else None)
        import torch_musa  # noqa: F401
        m = torch.get_device_module("musa")
        if m.is_available() and mcc and os.path.exists(mcc):
            major, minor = m.get_device_capability()
            out.update(backend="musa", arch=f"{major}{minor}", device=m.get_device_name())
    if "backend" not in out and torch.version.cuda:  # mtm: allow-cuda-name
        m = torch.get_device_module("cuda")
        if m.is_available():
            major, minor = m.get_device_capability()
            out.update(backend="cuda", arch=f"{major}.{minor}", device=m.get_device_name())
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def probe(python: str) -> dict:
    """backend, arch and device name of this machine as ``python``'s torch sees them (starts a device context in a
    child process only)."""
    done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (done.stderr.strip().splitlines() or ["probe printed nothing"])[-1]}


# ---- the plan ----------------------------------------------------------------------------------------------------
def cuda_arch_flags(arch: str) -> dict[str, str]:
    """Build for this device only: torch's extension helpers read TORCH_CUDA_ARCH_LIST (9.0), CMake wants 90.
    CUDACXX names nvcc where it is not on PATH but in the usual place (/usr/local/cuda/bin)."""
    flags = {"TORCH_CUDA_ARCH_LIST": arch, "CMAKE_ARGS": f"-DCMAKE_CUDA_ARCHITECTURES={arch.replace('.', '')}",
             "MTMEGATRON_BUILD_CUDA": "1"}
    if not shutil.which("nvcc") and os.path.exists("/usr/local/cuda/bin/nvcc"):
        flags["CUDACXX"] = "/usr/local/cuda/bin/nvcc"
    return flags


_INTERPRETER = r"""
import json, site, sys
print(json.dumps({"venv": sys.prefix != sys.base_prefix, "base": getattr(sys, "_base_executable", sys.executable),
                  "site": [p for p in site.getsitepackages() if p.startswith(sys.prefix)]}))
"""


def interpreter(python: str) -> dict:
    """Whether ``python`` runs in a venv, the interpreter that venv was made from, and the venv's own
    site-packages (where its torch lies)."""
    done = subprocess.run([python, "-c", _INTERPRETER], capture_output=True, text=True, timeout=60)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"venv": False, "base": python, "site": []}


def dry_run_venv(base_python: str, info: dict | None, venv: Path) -> list[list[str]]:
    """The commands that make the dry run's venv. ``--system-site-packages`` shows the *base* interpreter's packages
    only: when ``base_python`` is itself a venv (the usual developer set-up, torch installed in it), the new venv
    is made from that venv's base interpreter and a .pth file puts the running venv's site-packages on its path,
    ahead of the base interpreter's, and processes that venv's .pth files but mtmegatron's editable hook."""
    info = info or {"venv": False, "base": base_python, "site": []}
    make_from = info["base"] if info["venv"] else base_python
    cmds = [[make_from, "-m", "venv", "--clear", "--system-site-packages", str(venv)]]
    if info["venv"] and info["site"]:
        # the running venv's site-packages, then its .pth files (editable installs, path hooks) as site.py would
        # process them, except mtmegatron's own editable hook: the dry run installs mtmegatron into its own venv
        # (one line, as a .pth requires; names through __import__: site.py exec()s it in a function's scope)
        hooks = ("import site; [__import__('site').addpackage(d, n, set()) for d in %r for n in "
                 "sorted(__import__('os').listdir(d)) if n.endswith('.pth') and 'mtmegatron' not in n and not "
                 "n.startswith('_mtm_')]" % info["site"])
        py = str(venv / "bin/python")
        cmds.append([py, "-c", "import pathlib, site, sys; pathlib.Path(site.getsitepackages()[0], "
                     "'_mtm_parent_venv.pth').write_text(sys.argv[1]); print('parent venv on the path:', "
                     "sys.argv[1].splitlines()[:-1])", "\n".join([*info["site"], hooks]) + "\n"])
    return cmds


def make_plan(mode: str, backend: str, arch: str | None, device: str, out: Path, base_python: str,
              cores: int, interp: dict | None = None) -> Plan:
    dry = mode == "cpu-dry-run"
    work = Path(tempfile.gettempdir()) / "mtm-device-check"
    venv = work / "venv" if dry else None
    py = str(venv / "bin/python") if dry else base_python
    site = work / "site"
    wheels = ROOT / (".device/host" if dry else ".device/wheels")
    # no index and no pip configuration (a find-links or index-url in pip.conf would be another source)
    env = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PYTHONPATH": str(site),
           "PYTHONUNBUFFERED": "1", "CMAKE_BUILD_PARALLEL_LEVEL": str(cores)}
    boxes = BOXES[mode]

    install = []
    if dry:  # torch and the build tools from the system (or the running venv); megatron-core from the bundle only
        install += dry_run_venv(base_python, interp, venv)
    install.append([py, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                    "--upgrade", "--target", str(site), f"{wheels}/*.whl"])
    install.append([py, "-c", "import megatron.core, os, sys; f = os.path.realpath(megatron.core.__file__); "
                    f"site = os.path.realpath({str(site)!r}); print('megatron.core', megatron.core.__version__, "
                    "'from', f); sys.exit(0 if f.startswith(site + os.sep) else "
                    "'megatron.core does not come from the bundle: ' + f)"])

    build_env = {"MTMEGATRON_BUILD_CUDA": "0"} if backend != "cuda" else cuda_arch_flags(arch or "9.0")
    build = [[py, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps", "-e", str(ROOT),
              "--config-settings=build-dir=build/device/{wheel_tag}"]]
    if backend == "musa":
        build_env["TORCH_MUSA_ARCH_LIST"] = os.environ.get("TORCH_MUSA_ARCH_LIST", arch or "")
        build.append([py, "-m", "mtmegatron.ops.musa_build"])
    build.append([py, "-c", "import mtmegatron._C as c; print('mtmegatron._C from', c.__file__)"])
    build.append([py, "-m", "mtmegatron.cli", "env"])

    if backend == "cpu":  # the cpu-parametrized twins of the gpu-marked tests
        select = ["-k", "cpu", "-m", "not slow"]
    else:
        select = ["-m", "gpu"]
    conformance = [[py, "-m", "pytest", *select, str(ROOT / "tests/conformance"), "-p", "no:cacheprovider",
                    "-rs", "-q", "--junitxml", str(work / "conformance.xml")]]

    jobs = 2 if dry else 6  # device runs beside cpu reference runs: 16 cores, one GPU
    if mode == "quick":
        train_flags = ["--models", "llama3", "--train-iters", "8"]
    elif dry:
        # torch._scaled_mm on cpu is a slow reference (~5 min a step of the tiny model): the step section's tiny
        # FP8 row runs it instead. The kernel check's GPU-sized shapes take minutes here: the build section's
        # `mtmegatron.cli env` shows the native cpu kernels registered.
        train_flags = ["--train-iters", "4", "--tp2", "off", "--fp8-executors", "emulated", "--skip-kernels"]
    else:
        train_flags = ["--train-iters", "10"]
    train = [[py, str(ROOT / "scripts/gpu_train_check.py"), "--backend-under-test", backend, *train_flags,
              "--jobs", str(jobs), "--work-dir", str(work / "train_check"), "--json", str(work / "train_check.json")]]

    step_flags = ["--impls", "local,mtmegatron", "--no-ablation", "--fp8", "on", "--peers", "megatron-lm,torchtitan",
                  "--json", str(work / "step.json")]
    if mode == "quick":  # the first GPU runs' shapes (2 dense layers, one micro-batch)
        step_flags += ["--quick", "--iters", "4", "--warmup", "2"]
    elif dry:
        step_flags += ["--cpu-size", "tiny", "--iters", "2", "--warmup", "1", "--threads", str(cores)]
    else:  # representative shapes: 8B layers as fit (at most 8), 8 micro-batches, distributed optimizer
        step_flags += ["--iters", "2", "--warmup", "1", "--threads", "8"]
    step = [[py, str(ROOT / "benchmarks/step.py"), "--backend", backend, *step_flags]]
    profile = [[py, str(ROOT / "benchmarks/profile_step.py"), "--backend", backend, "--out", str(out),
                "--warmup", "1", "--threads", str(cores if dry else 8), *(["--cpu-size", "tiny"] if dry else [])]]

    sections = [
        Section("install", boxes["install"], install),
        Section("build", boxes["build"], build, build_env, needs=("install",)),
        Section("conformance", boxes["conformance"], conformance, {"MTMEGATRON_REQUIRE_BACKENDS": backend},
                needs=("build",)),
        Section("train_check", boxes["train_check"], train, needs=("build",)),
        Section("step", boxes["step"], step, needs=("build",)),
    ]
    if "profile" in boxes:
        sections.append(Section("profile", boxes["profile"], profile, needs=("build",)))
    return Plan(mode, backend, arch, device, py, base_python, str(venv) if venv else None, str(site), str(wheels),
                str(out), str(work), cores, BUDGET_S[mode], env, sections)


# ---- running -----------------------------------------------------------------------------------------------------
def expand(cmd: list[str]) -> list[str]:
    """The one glob a command holds (the wheel folder's *.whl), expanded as a shell would."""
    out = []
    for arg in cmd:
        if arg.endswith("/*.whl"):
            out += sorted(str(p) for p in Path(arg[:-6]).glob("*.whl")) or [arg]
        else:
            out.append(arg)
    return out


def run_section(section: Section, box_s: int, plan: Plan, log: Path) -> tuple[str, float, str]:
    """Runs the section's commands in order under one `timeout` box; (status, seconds, last lines)."""
    env = {**os.environ, **plan.env, **section.env}
    start = time.monotonic()
    status, tail = "PASS", ""
    with open(log, "w") as f:
        for cmd in section.commands:
            left = box_s - (time.monotonic() - start)
            if left < 1:
                status = "TIMEOUT"
                break
            cmd = expand(cmd)
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            done = subprocess.run(["timeout", "-k", str(KILL_AFTER_S), str(int(left)), *cmd], stdout=f,
                                  stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            if done.returncode in (124, 137):
                status = "TIMEOUT"
                f.write(f"[device_check] time box of {box_s}s reached\n")
                break
            if done.returncode != 0:
                status = "FAIL"
                f.write(f"[device_check] exit status {done.returncode}\n")
                break
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    tail = "\n".join(lines[-12:])
    return status, time.monotonic() - start, tail


def section_figures(name: str, plan: Plan, log: Path) -> dict:
    """The figures a section produced (parsed from its log or the JSON its script wrote)."""
    work = Path(plan.work)
    text = log.read_text(errors="replace") if log.is_file() else ""
    if name == "install":
        m = re.search(r"megatron\.core (\S+) from (\S+)", text)
        return {"megatron_core": m.group(1), "megatron_core_file": m.group(2)} if m else {}
    if name == "build":
        figures = {}
        for key, pattern in (("torch", r"^\s*torch\s+(\S+)"), ("megatron_core", r"^\s*megatron-core\s+(\S+)"),
                             ("selected", r"^selected: (\S+)"), ("native_kernels", r"^native kernels on (.+?) \|"),
                             ("kernel_build", r"^native kernels on .+? \| build (.+)$"),
                             ("extension", r"^mtmegatron\._C from (\S+)")):
            m = re.search(pattern, text, re.M)
            if m:
                figures[key] = m.group(1).strip()
        return figures
    if name == "conformance":
        m = re.findall(r"=+ (.*?) in ([\d.]+)s", text) or re.findall(r"^(\d+ (?:passed|failed).*?) in ([\d.]+)s",
                                                                       text, re.M)
        figures = {}
        if m:
            summary, seconds = m[-1]
            figures = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)",
                                                         summary)}
            figures["pytest_s"] = float(seconds)
        return figures
    path = (Path(plan.out) if name == "profile" else work) / f"{name}.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return {"error": f"{path} is not complete JSON"}
    return {}


def fmt(v, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def render_report(plan: Plan, results: list[dict], wall_s: float) -> str:
    title = "CPU dry run of the GPU lane" if plan.mode == "cpu-dry-run" else f"GPU lane on {plan.device}"
    lines = [f"# {title}", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; mode {plan.mode}; backend "
             f"{plan.backend}; device {plan.device}; arch {plan.arch or 'n/a'}; {plan.cores} cores",
             f"- python {plan.python}; megatron-core from {plan.wheels} into {plan.site} (pip --no-index)",
             f"- total {wall_s:.0f}s of a {plan.budget_s}s budget", "",
             "| section | status | time (s) | box (s) | figures |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['name']} | {r['status']} | {r['seconds']:.0f} | {r['box_s']} | {r['summary']} |")
    for r in results:
        lines += ["", f"## {r['name']}: {r['status']} in {r['seconds']:.0f}s (box {r['box_s']}s; log {r['log']})"]
        fig = r["figures"]
        if r["name"] == "train_check" and fig.get("results"):
            lines += ["", "| check | status | detail |", "|---|---|---|"]
            lines += [f"| {c['check']} | {c['status']} | {c['detail']} |" for c in fig["results"]]
        elif r["name"] == "step" and fig.get("rows"):
            mm = fig.get("matmul") or {}
            peak = fmt(fig.get("peak_datasheet_bf16_tflops"))
            lines += ["", f"device {fig.get('device')}; datasheet bf16 peak {peak} TFLOP/s; measured {mm.get('n')}^3 "
                      f"{mm.get('dtype')} matmul {mm.get('tflops') or 0:.4g} TFLOP/s; {fig.get('iters')} timed "
                      f"iterations after {fig.get('warmup')}"]
            for model, m in (fig.get("models") or {}).items():
                shares = m.get("flop_shares") or {}
                lines.append(f"- {model}: {m.get('layers')} layers, {m.get('micro_batches')} micro-batches a step, "
                             f"output layer {100 * shares.get('output_layer', 0):.0f}% of the GEMM+attention FLOPs: "
                             f"`{' '.join(m.get('flags', []))}`")
            if fig.get("megatron_lm_source"):
                lines.append(f"- Megatron-LM from {fig['megatron_lm_source']}")
            lines += ["", "| row | model | ms/step | TFLOP/s | MFU (datasheet) | MFU (matmul) | / plain | / bound "
                      "| peak GiB | fusions |", "|---|---|---|---|---|---|---|---|---|---|"]
            for row in fig["rows"]:
                if "error" in row or "skipped" in row:
                    what = f"failed: {row['error']}" if "error" in row else f"not run: {row['skipped']}"
                    lines.append(f"| {row['row']} | {row['model']} | {what} | | | | | | | |")
                    continue
                pct = lambda v: "n/a" if v is None else f"{v:.1f}%"  # noqa: E731
                ratio = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
                gib = "n/a" if row.get("peak_gib") is None else f"{row['peak_gib']:.2f}"
                lines.append(f"| {row['row']} | {row['model']} | {row['ms']:.1f} | {row['tflops']:.4g} | "
                             f"{pct(row['mfu_datasheet_pct'])} | {pct(row['mfu_matmul_pct'])} | "
                             f"{ratio(row.get('vs_plain'))} | {ratio(row.get('vs_bound'))} | {gib} | "
                             f"{row['fusions']} |")
        elif r["name"] == "profile" and fig.get("top"):
            md = Path(plan.out) / "profile.md"
            lines += ["", md.read_text().rstrip() if md.is_file() else "", "",
                      f"trace: {fig.get('trace')} (chrome://tracing, Perfetto)"]
        elif fig:
            lines += [""] + [f"- {k}: {v}" for k, v in fig.items()]
        if r["status"] not in ("PASS", "SKIPPED"):
            lines += ["", "```", r["tail"], "```"]
    return "\n".join(lines) + "\n"


def summarize(name: str, fig: dict) -> str:
    if name == "train_check" and fig.get("results"):
        res = fig["results"]
        return (f"{sum(c['status'] == 'PASS' for c in res)} passed, {sum(c['status'] == 'FAIL' for c in res)} "
                f"failed, {sum(c['status'] == 'SKIP' for c in res)} skipped")
    if name == "step" and fig.get("rows"):
        ok = [r for r in fig["rows"] if "error" not in r and "skipped" not in r]
        skipped = sum("skipped" in r for r in fig["rows"])
        best = max((r for r in ok if r["row"] not in ("plain PyTorch loop", "GEMM + attention bound")),
                   key=lambda r: r["tflops"], default=None)
        mm = (fig.get("matmul") or {}).get("tflops")
        return (f"{len(ok)} rows ({len(fig['rows']) - len(ok) - skipped} failed, {skipped} not run); matmul "
                f"{mm or 0:.4g} TFLOP/s"
                + (f"; best {best['row']} {best['tflops']:.4g} TFLOP/s" if best else ""))
    if name == "profile" and fig.get("phases_pct"):
        return f"{fig['steps']} steps, wall {fig['wall_ms']:.1f} ms: " + ", ".join(
            f"{p} {v:.0f}%" for p, v in fig["phases_pct"].items())
    return ", ".join(f"{k} {v}" for k, v in fig.items() if not isinstance(v, (dict, list)))


def _result(name: str, status: str, seconds: float, box: int, log: Path, plan: Plan, tail: str) -> dict:
    fig = section_figures("build" if name == "build_without_kernels" else name, plan, log)
    return {"name": name, "status": status, "seconds": seconds, "box_s": box, "log": log.name, "figures": fig,
            "summary": summarize(name, fig), "tail": tail}


def execute(plan: Plan) -> int:
    out, work = Path(plan.out), Path(plan.work)
    out.mkdir(parents=True, exist_ok=True)
    if plan.venv:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    for stale in ("train_check.json", "step.json"):
        (work / stale).unlink(missing_ok=True)
    for stale in ("profile.json", "profile.md", "profile_trace.json.gz"):
        (out / stale).unlink(missing_ok=True)
    shutil.rmtree(plan.site, ignore_errors=True)
    start, spare, results, passed = time.monotonic(), 0.0, [], set()
    problems = check_wheels(Path(plan.wheels), read_manifest())
    for section in plan.sections:
        box = int(section.box_s + spare)
        log = out / f"{section.name}.log"
        missing = [n for n in section.needs if n not in passed]
        if section.name == "install" and problems:
            status, seconds, tail = "FAIL", 0.0, "\n".join(problems)
            log.write_text(tail + "\n")
        elif missing:
            status, seconds, tail = "SKIPPED", 0.0, f"skipped: {', '.join(missing)} did not pass"
            log.write_text(tail + "\n")
        else:
            print(f"[device_check] {section.name}: up to {box}s ...", flush=True)
            status, seconds, tail = run_section(section, box, plan, log)
            if status == "FAIL" and section.env.get("MTMEGATRON_BUILD_CUDA") == "1":
                results.append(_result(section.name, status, seconds, box, log, plan, tail))
                # the GPU kernels did not build: the rest of the lane still says what runs on the device
                section = Section("build_without_kernels", 0, section.commands,
                                  {**section.env, "MTMEGATRON_BUILD_CUDA": "0"}, section.needs)
                log, first = out / "build_without_kernels.log", seconds
                box = int(box - first)
                print(f"[device_check] the kernel build failed; building without kernels, up to {box}s ...",
                      flush=True)
                status, seconds, tail = run_section(section, box, plan, log)
                if status == "PASS":
                    passed.add("build")
        spare = max(0.0, box - seconds) if status != "SKIPPED" else box
        if status == "PASS":
            passed.add(section.name)
        results.append(_result(section.name, status, seconds, box, log, plan, tail))
        print(f"[device_check] {section.name}: {status} in {seconds:.0f}s {results[-1]['summary']}", flush=True)
    wall = time.monotonic() - start
    report = render_report(plan, results, wall)
    (out / "device_report.md").write_text(report)
    (out / "device_report.json").write_text(json.dumps(
        {"plan": plan_dict(plan), "wall_s": wall, "sections": results}, indent=1, default=str))
    print(report, flush=True)
    print(f"[device_check] report and logs in {out}", flush=True)
    return 0 if all(r["status"] == "PASS" for r in results) else 1


def plan_dict(plan: Plan) -> dict:
    d = asdict(plan)
    d["sections"] = [{**asdict(s), "commands": [shlex.join(c) for c in s.commands]} for s in plan.sections]
    d["boxes_total_s"] = sum(s.box_s for s in plan.sections)
    d["report_files"] = list(REPORT_FILES)
    return d


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sections that fit in 4 minutes")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="the same flow on this CPU machine (--backend cpu, fresh venv, pip index off)")
    p.add_argument("--print-plan", action="store_true", help="print the plan as JSON and run nothing")
    p.add_argument("--out", default=None, help="report folder (default: $OUT when set, else ./device-report)")
    p.add_argument("--backend", choices=("cuda", "musa", "cpu"), default=None,
                   help="skip the detection (with --print-plan: plan for a machine this is not)")
    p.add_argument("--arch", default=None, help="the device architecture (9.0 for an H100), with --backend")
    p.add_argument("--python", default=sys.executable, help="the interpreter holding torch (default: this one)")
    a = p.parse_args(argv)
    mode = "cpu-dry-run" if a.cpu_dry_run else "quick" if a.quick else "full"
    if a.cpu_dry_run and a.quick:
        print("device_check: --cpu-dry-run already uses CPU sizes; drop --quick", file=sys.stderr)
        return 2
    if a.cpu_dry_run and a.backend not in (None, "cpu"):
        print("device_check: --cpu-dry-run runs --backend cpu", file=sys.stderr)
        return 2
    out = Path(a.out or os.environ.get("OUT") or ROOT / "device-report").resolve()
    cores = os.cpu_count() or 1
    if a.cpu_dry_run:
        backend, arch, device = "cpu", None, f"cpu ({cores} cores)"
    elif a.backend:
        backend, arch, device = a.backend, a.arch, f"{a.backend} (given, not detected)"
    else:
        found = probe(a.python)
        if "backend" not in found:
            why = found.get("error") or f"torch {found.get('torch')} sees no CUDA or MUSA device"
            print(f"device_check: no GPU here ({why}); on a CPU machine run --cpu-dry-run", file=sys.stderr)
            return 2
        backend, arch, device = found["backend"], found["arch"], found["device"]
    plan = make_plan(mode, backend, arch, device, out, a.python, cores,
                     interpreter(a.python) if a.cpu_dry_run else None)
    if backend == "musa":
        print("device_check: the musa flow has not run on a MUSA machine yet (none was lent); it is untried",
              flush=True)
    if a.print_plan:
        print(json.dumps(plan_dict(plan), indent=1))
        return 0
    return execute(plan)


if __name__ == "__main__":
    sys.exit(main())
