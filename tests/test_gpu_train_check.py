"""scripts/gpu_train_check.py (the GPU lane's training checks): its comparison and reporting logic, and one real
cpu-vs-cpu run (--backend-under-test cpu) so the lane's plumbing is exercised without a GPU."""
from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_train_check", ROOT / "scripts/gpu_train_check.py")
gtc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_train_check"] = gtc  # dataclasses look their module up
_spec.loader.exec_module(gtc)


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
                   "--skip-fp8", "--work-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "| PASS   | first 10.00000 -> last 8.50000 |" in out
    assert "FAIL" in out and "diff 1.00e-01 (tol 1e-05)" in out
    assert "2-rank TP2 runs" in out and "SKIP" in out


def test_cpu_vs_cpu_run_passes(tmp_path, capsys):
    rc = gtc.main(["--backend-under-test", "cpu", "--models", "llama3", "--dtypes", "fp32", "--train-iters", "2",
                   "--tp2", "off", "--skip-kernels", "--skip-fp8", "--work-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert re.search(r"\| llama3/fp32 first loss cpu vs cpu\s*\| PASS\s*\| .*diff 0.00e\+00", out), out
    assert gtc.read_losses(tmp_path / "cpu" / "llama3/fp32")[0] > 0
