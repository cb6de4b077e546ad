"""The house rules as checks: the layering contract (``.importlinter``: entry points down to the utility floor, no
circles among the modules of any package, every import counted, function-local ones too; the model families
independent of each other), device-type branches only in backends/ and the bridge (at most 3 elsewhere, each
commented), and a model family's name in at most 2 files outside its family module, the family registry and tests.
Figures come from scripts/house_report.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_DEVICE_BRANCHES = 3
MAX_FAMILY_FILES = 2
LINT_CONTRACTS = ("no import circles among the modules of any mtmegatron package",
                  "model families are independent of each other")


def _report() -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "house_report.py"), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_import_contract_is_kept():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    proc = subprocess.run([lint, "--no-cache"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
    for contract in LINT_CONTRACTS:  # each still declared in .importlinter, and kept
        assert f"{contract} KEPT" in " ".join(proc.stdout.split()), contract


def test_house_figures():
    report = _report()
    assert report["module_circles"] == [], report["module_circles"]
    branches = report["device_branches"]
    assert len(branches) <= MAX_DEVICE_BRANCHES, "\n".join(branches)
    for line in branches:
        assert "#" in line.split(":", 2)[2], f"uncommented device-type branch: {line}"
    spread = {family: files for family, files in report["family_outside"].items() if len(files) > MAX_FAMILY_FILES}
    assert not spread, json.dumps(spread, indent=1)
