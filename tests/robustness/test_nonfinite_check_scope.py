"""The inf/nan step check reads the gradients, not the padding around them (training/resilience/robustness.py).

Megatron-FSDP's temporary gradient buckets are ``torch.empty``: the padding between and after the parameters keeps
what the allocator handed back and is reduce-scattered into the main-grad shard with them. A check over the whole
buffer skipped steps whenever those bytes were non-finite (about 1 run in 3 with optim_grads_params on the cpu
backend). Here every new bucket starts as NaN (tests/helpers/nan_grad_bucket_padding) and the patch that zeroes
buckets (patches/megatron_fsdp_zeroed_grad_bucket.py) is off: no step may be skipped and the run must learn.
Measured by hand: the losses then equal DDP + the distributed optimizer's within 1.2e-7; the whole-buffer check
skipped all 5 steps. One 2-rank job, ~12 s.
"""

from __future__ import annotations

from pathlib import Path

from helpers.pretrain_runner import TINY, run_pretrain

HOOK = Path(__file__).parent.parent / "helpers" / "nan_grad_bucket_padding"


def test_nan_in_megatron_fsdp_bucket_padding_skips_no_step(tmp_path):
    log = tmp_path / "nan_buckets.txt"
    env = {"PYTHONPATH": str(HOOK), "NAN_PADDING_LOG": str(log),
           "MTMEGATRON_DISABLE_PATCHES": "megatron_fsdp_zeroed_grad_bucket"}
    _, rows = run_pretrain(2, TINY + ["--train-iters", "6", "--use-megatron-fsdp", "--use-distributed-optimizer",
                                      "--data-parallel-sharding-strategy", "optim_grads_params"],
                           tmp_path / "run", env=env)
    assert log.exists() and log.read_text().strip(), "the NaN-filling hook never ran"
    assert [r["skipped"] for r in rows] == [False] * 6, rows
    assert all(r["grad_norm"] is not None for r in rows), rows
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3, [r["loss"] for r in rows]
