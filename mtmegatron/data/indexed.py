"""Checks that a megatron-core indexed dataset (``<prefix>.bin`` + ``<prefix>.idx``) is whole before training
reads it, so a missing, truncated or corrupt file is one clear message instead of an assertion deep inside
megatron-core's memory-mapped reader.

The ``.idx`` layout (megatron-core ``indexed_dataset._IndexWriter``): 9-byte magic ``MMIDIDX\\0\\0``, u64
version 1, u8 dtype code, u64 sequence count S, u64 document count D, then S int32 lengths, S int64 byte
pointers, D int64 document indices. The ``.bin`` holds exactly sum(lengths) tokens of that dtype.
May assume: nothing beyond numpy; reads only the headers and the index arrays.
"""

from __future__ import annotations

import os
import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
_HEADER = 9 + 8 + 1 + 8 + 8
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
           8: np.uint16}


class DataError(ValueError):
    """A dataset that cannot be read as asked; the message names the file and what is wrong with it."""


def check_indexed_dataset(prefix: str) -> dict:
    """Raise DataError unless ``prefix``.idx/.bin form a whole dataset; returns its counts."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    missing = [p for p in (idx, bin_) if not os.path.isfile(p)]
    if missing:
        raise DataError(f"dataset {prefix}: missing {' and '.join(missing)} (make it with `mtmegatron preprocess`)")
    size = os.path.getsize(idx)
    with open(idx, "rb") as f:
        head = f.read(_HEADER)
        if len(head) < _HEADER or head[:9] != MAGIC:
            raise DataError(f"{idx} is not a megatron-core index file (bad header); re-run `mtmegatron preprocess`")
        version, code, num_seqs, num_docs = struct.unpack("<QBQQ", head[9:])
        if version != 1 or code not in _DTYPES:
            raise DataError(f"{idx} is corrupt (version {version}, dtype code {code})")
        expected = _HEADER + num_seqs * (4 + 8) + num_docs * 8
        if size < expected:
            raise DataError(f"{idx} is truncated ({size} bytes, its header announces {expected})")
        lengths = np.fromfile(f, dtype=np.int32, count=num_seqs)
    itemsize = np.dtype(_DTYPES[code]).itemsize
    tokens = int(lengths.astype(np.int64).sum())
    bin_size = os.path.getsize(bin_)
    if (lengths < 0).any() or bin_size != tokens * itemsize:
        raise DataError(f"{bin_} does not match its index ({bin_size} bytes; {idx} describes {tokens} tokens of "
                        f"{itemsize} bytes): one of the two is truncated or from another run")
    return {"sequences": num_seqs, "documents": max(num_docs - 1, 0), "tokens": tokens}
