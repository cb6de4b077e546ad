"""The cache of the embedded generated datasets (``shapes.py``, ``textures.py``): each set in its own directory under
``$MTMEGATRON_CACHE`` (``data/embedded.cache_root``), generated once. Every rank may ask at once: the first takes
an exclusive file lock and generates, the others wait on the lock and then find the ``complete`` marker (written
after the last file).
May assume: a POSIX file system (fcntl locks, as ``data/embedded.py``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def locked(directory: str) -> Iterator[None]:
    """``directory`` (created) held under its exclusive file lock."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def generate_once(directory: str, generate: Callable[[str], object]) -> None:
    """``generate(directory)`` unless an earlier call completed it; the caller holds ``locked(directory)``."""
    marker = os.path.join(directory, "complete")
    if not os.path.exists(marker):
        generate(directory)
        with open(marker, "w") as f:
            f.write("ok\n")


def draw_unseen(draw: Callable[[], object], pixels_of: Callable[[object], object], split: str,
                train_hashes: set) -> object:
    """``draw()`` once for the train split (its pixels' hash recorded in ``train_hashes``); for a held-out split,
    again until its pixels match no training picture. The generators' one rule for disjoint splits."""
    while True:
        drawn = draw()
        digest = hashlib.sha1(pixels_of(drawn).tobytes()).digest()
        if split == "train":
            train_hashes.add(digest)
            return drawn
        if digest not in train_hashes:
            return drawn
