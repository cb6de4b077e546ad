"""Spreading a global batch's vision-language samples over data-parallel ranks and micro-batches so that each
micro-batch carries about the same work.

A sample's load is its text tokens plus its vision patches (the vision tower's input: what a native-resolution
image costs grows with its area). Samples of one global batch differ a lot (an icon vs a document page), so the
contiguous slices of the sampled order leave some micro-batches, and some ranks, with several times the mean:
every rank then waits for the slowest at each gradient reduction, and every pipeline stage for the heaviest
micro-batch. ``balance`` assigns the samples of one global batch to ``dp`` ranks x ``micro`` micro-batches of
exactly ``mbs`` samples each, heaviest first into the lightest bin with room (deterministic: ties go by position),
so the set of samples per global batch — and with it the gradient, up to summation order, and the data position —
is what it was; only who carries which changes.
May assume: ``len(loads) == dp * micro * mbs`` (the global batch as the sample plan cut it).
"""

from __future__ import annotations


def balance(loads: list[int], dp: int, mbs: int) -> list[list[list[int]]]:
    """``[rank][micro-batch] -> positions`` (indices into ``loads``, each micro-batch in ascending order)."""
    bins = len(loads) // mbs
    if bins * mbs != len(loads) or bins % dp:
        raise ValueError(f"{len(loads)} samples do not fill {dp} ranks of micro-batches of {mbs}")
    totals, members = [0] * bins, [[] for _ in range(bins)]
    for position in sorted(range(len(loads)), key=lambda p: (-loads[p], p)):
        open_bins = [b for b in range(bins) if len(members[b]) < mbs]
        target = min(open_bins, key=lambda b: (totals[b], b))
        totals[target] += loads[position]
        members[target].append(position)
    per_rank = bins // dp
    # the micro-batches heaviest first, dealt to the ranks back and forth so each rank's sum evens out too
    by_load = sorted((sorted(m) for m in members), key=lambda m: (-sum(loads[p] for p in m), m[0]))
    ranks = [[] for _ in range(dp)]
    for k, micro in enumerate(by_load):
        ranks[_snake(k, dp)].append(micro)
    assert all(len(r) == per_rank for r in ranks)
    return [sorted(r, key=lambda m: m[0]) for r in ranks]


def _snake(k: int, dp: int) -> int:
    """0, 1, ..., dp-1, dp-1, ..., 0, 0, 1, ...: the rank of the k-th heaviest micro-batch."""
    turn, offset = divmod(k, dp)
    return offset if turn % 2 == 0 else dp - 1 - offset


def contiguous(n: int, dp: int, mbs: int) -> list[list[list[int]]]:
    """The plain assignment (each rank its contiguous slice, cut into micro-batches), for comparison."""
    per_rank = n // dp
    return [[list(range(r * per_rank + m, r * per_rank + m + mbs)) for m in range(0, per_rank, mbs)]
            for r in range(dp)]


def peak_to_mean(loads: list[int], assignment: list[list[list[int]]]) -> tuple[float, float]:
    """(max / mean micro-batch load, max / mean rank load) of an assignment."""
    micro = [sum(loads[p] for p in m) for rank in assignment for m in rank]
    ranks = [sum(loads[p] for m in rank for p in m) for rank in assignment]
    return max(micro) / (sum(micro) / len(micro)), max(ranks) / (sum(ranks) / len(ranks))
