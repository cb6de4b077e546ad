"""Every pretrain run's Adam is mtmegatron's FusedAdam on the fused ``mtmegatron::adam_step`` kernel (megatron-core
would build a per-tensor torch AdamW without TE/apex), and it trains like torch's AdamW.

The kernel calls are counted by FusedAdam and read back through offload_stats (MTMEGATRON_OPTIMIZER_STATS hook);
the reference run disables the patch (megatron's own torch AdamW) and must show no kernel call. Tolerance: relative
1e-5 per iteration over 4 iterations (fp32; the update differs from torch's only in the order of float operations).
fp32 only: with ``--bf16`` (not precision-aware) megatron's Float16OptimizerWithFloat16Params hands the Adam fp32
main params with fp32 gradients, so the Adam runs exactly the code it runs in fp32 and the class is chosen the same
way; FusedAdam's bf16/master-weight path (precision-aware) runs in the bf16 offload tests (test_offload.py).
"""

from __future__ import annotations

import json

from helpers.pretrain_runner import TINY, run_pretrain

ITERS = 4


def _run(tmp_path, name, extra, env=None):
    stats = tmp_path / name / "stats"
    proc, rows = run_pretrain(1, TINY + ["--train-iters", str(ITERS), *extra], tmp_path / name,
                              env={"MTMEGATRON_OPTIMIZER_STATS": str(stats), **(env or {})})
    return proc.stdout, rows, json.loads((stats / "rank0.json").read_text())


def test_fused_adam_step_runs_and_matches_torch_adamw(tmp_path):
    extra = []
    out, fused, stats = _run(tmp_path, "fused", extra)
    assert "optimizer: mtmegatron.FusedAdam" in out, out[-2000:]
    # one call per step per (device, step, grad dtype) group of each param group (decay / no decay)
    assert ITERS <= stats["fused_adam_calls"] <= 2 * ITERS, stats
    out, torch_rows, torch_stats = _run(tmp_path, "torch", extra,
                                        env={"MTMEGATRON_DISABLE_PATCHES": "optimizer_fused_adam"})
    assert "optimizer: torch.AdamW" in out, out[-2000:]
    assert torch_stats["fused_adam_calls"] == 0
    assert fused[0]["loss"] == torch_rows[0]["loss"]
    for a, b in zip(fused, torch_rows):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a, b)
    assert fused[-1]["loss"] < fused[0]["loss"]
