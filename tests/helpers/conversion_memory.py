"""``hwm_within_bound(stats, what)``: a streaming conversion's workers kept their peak memory (VmHWM growth) below
2 x the largest tensor + ``SLACK``, read from the converter's ``conversion_complete.json`` stats."""

from __future__ import annotations

SLACK = 48 * 2**20


def hwm_within_bound(stats: dict, what: str, bites: bool = True) -> None:
    """Every worker's VmHWM growth below 2 x the largest tensor + SLACK; ``bites``: the largest tensor is large
    enough that a writer peaking at 3.5 x it fails (the checkpoint of tests/convert/test_streaming.py)."""
    largest, total = stats["largest_tensor_bytes"], stats["bytes"]
    assert total >= 8 * largest, stats
    if bites:
        assert 3.5 * largest > 2 * largest + SLACK, stats
    assert stats["workers"] == 2
    for base, peak in zip(stats["worker_baseline_vm_hwm_bytes"], stats["worker_vm_hwm_bytes"]):
        print(f"\n{what} worker VmHWM {peak / 2**20:.0f} MB (before reading {base / 2**20:.0f} MB); largest tensor "
              f"{largest / 2**20:.0f} MB, checkpoint {total / 2**20:.0f} MB, {total / stats['seconds'] / 1e6:.1f} MB/s")
        assert peak - base < 2 * largest + SLACK, (peak, base, largest)
