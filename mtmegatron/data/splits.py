"""The splits of a pretrain run's data: the per-split blends, the samples asked of each split, and the splits a
``--split`` share leaves empty.

``per_split_paths``: megatron-core's ``blend_per_split`` from ``--train/valid/test-data-path`` (None without them).
``requested_splits`` / ``empty_splits``: the samples asked of each split, and the splits a ``--split`` share
leaves empty (megatron-core's GPTDataset would loop forever drawing samples from one; data/resolve.py refuses it).
config/data_flags.py checks the flags with them; training/data.py builds the datasets with them.
Each takes data/section.py's ``Splits`` (the data paths and ``--split``), built by its caller.
May assume: the data flags parsed and checked (config/data_flags.py); megatron-core imported only when called.
"""

from __future__ import annotations

from mtmegatron.data.section import Splits


def per_split_paths(splits: Splits) -> list | None:
    """[train, valid, test] blends when any per-split path is given, else None."""
    paths = [splits.train_data_path, splits.valid_data_path, splits.test_data_path]
    return paths if any(p is not None for p in paths) else None


def requested_splits(splits: Splits, num_valid: int | None) -> list[int | None]:
    """Samples asked of the [train, valid, test] splits beyond train's (filled by the caller): megatron-core
    accepts None (one epoch) only for an unweighted blend; a weighted one needs a number for every split, and
    the test split (never read here) gets as many as valid, as Megatron-LM's ``--eval-iters`` does."""
    weighted = splits.data_path and get_blend(splits.data_path)[1] is not None
    if weighted:
        return [num_valid or 0, num_valid or 0]
    return [num_valid, None]


def get_blend(data_path: list[str]):
    from megatron.core.datasets.utils import get_blend_from_list

    return get_blend_from_list(data_path)


def empty_splits(splits: Splits, num_sequences: int, num_valid: int | None) -> list[str]:
    """The splits of one ``--data-path`` prefix with ``num_sequences`` sequences that ``--split`` gives a share
    but no sequence while samples are asked of them (megatron-core's GPTDataset would then loop forever)."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix, parse_and_normalize_split)

    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(splits.split))
    sizes = [1] + requested_splits(splits, num_valid)
    return [name for name, bounds, size in zip(("train", "valid", "test"), matrix, sizes)
            if bounds is not None and size is not None
            and int(round(bounds[0] * num_sequences)) == int(round(bounds[1] * num_sequences))]
