"""convert/streaming_export.py's work split: workers get contiguous runs of the model's groups balanced by bytes,
and each run begins a safetensors shard of its own, so no two workers write into one file (buffered writes to one
file serialize on its inode lock). Pure planning: no checkpoint, no process."""

from __future__ import annotations

import pytest
import torch

from mtmegatron.convert.streaming_export import _plan_shards, _split


@pytest.mark.parametrize("nbytes, workers, want", [
    ([10] * 10, 2, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]),
    ([100, 1, 1, 1], 2, [[0], [1, 2, 3]]),
    ([1, 1, 1, 100], 2, [[0, 1, 2], [3]]),
    ([5, 5], 4, [[0], [1]]),            # more workers than groups: one group each, no empty part
    ([7], 2, [[0]]),
    ([10] * 9, 3, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
])
def test_split_is_contiguous_and_balanced(nbytes, workers, want):
    assert _split(nbytes, workers) == want


def test_split_of_a_model_like_list_covers_every_group_once_within_one_group_of_balance():
    nbytes = [262] + [13, 13, 13, 90, 45] * 20 + [2, 262]          # embedding, layers, final norm, output layer
    parts = _split(nbytes, 3)
    assert [i for p in parts for i in p] == list(range(len(nbytes)))
    loads = [sum(nbytes[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= 2 * max(nbytes), loads


def test_each_worker_writes_files_of_its_own():
    bf16 = torch.bfloat16
    outputs = [[(f"g{g}.t{t}", (4, 8), bf16) for t in range(3)] for g in range(6)]   # 6 groups, 192 B each
    parts = _split([192] * 6, 2)
    files, where, _, sizes = _plan_shards(outputs, 10**9, frozenset(p[0] for p in parts[1:]))
    assert len(files) == 2 and files[0] == "model-00001-of-00002.safetensors"
    owner = {}
    for worker, groups in enumerate(parts):
        for g in groups:
            for name, _, _ in outputs[g]:
                owner.setdefault(where[name][0], set()).add(worker)
    assert all(len(workers) == 1 for workers in owner.values()), owner
    # one worker (no breaks): one file while under the shard size; the size limit still splits inside a run
    assert len(_plan_shards(outputs, 10**9)[0]) == 1
    files, where, _, _ = _plan_shards(outputs, 3 * 64, frozenset(p[0] for p in parts[1:]))
    assert len(files) == 6 and len({where[f"g{g}.t0"][0] for g in range(6)}) == 6
