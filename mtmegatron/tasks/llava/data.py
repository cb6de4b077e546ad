"""LLaVA training data: the multimodal datasets (``data/multimodal``) read in an order that does not depend on
the parallel layout, as ``training/data.py`` does for text.

``prepare`` builds the train and held-out datasets before any process group starts (default: the embedded
shapes dataset; ``--data-path x.jsonl [--image-folder DIR]``: the user's LLaVA/ShareGPT data) and turns every
data problem into one ``ConfigError``. ``--mock-data`` is refused for LLaVA (one message): an all-zero image
cannot show that the vision path learns anything.

Global batch ``i`` is positions ``[i*G, (i+1)*G)`` of the training order (a permutation of the dataset per
epoch, seeded by ``--seed``; the held-out split is read in file order); data-parallel rank ``d`` takes the
``d``-th contiguous slice, cut into micro-batches and collated (``llava_collate.py``'s batch contract). Every pipeline
stage reads the whole micro-batch: the first needs images and tokens, the last tokens, labels, loss mask and tile
counts to expand labels to the combined sequence. The number of image embeddings of a step is known from the
index without loading an image (``image_tokens``), identically on every rank. ``VisionReader`` is the vision
tasks' reader (a Step's ``micro_batches``): the batch sizes, the data-parallel size and tasks/section.py's
``VisionReading``.
May assume: flags validated (``--model llava``); ``img_seq_len`` from ``models/llava_args.image_embeddings_per_tile``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mtmegatron.data.position import SamplePlan
from mtmegatron.data.section import Batches
from mtmegatron.data.vision.section import LlavaData
from mtmegatron.tasks.section import VisionReading
from mtmegatron.utils.errors import ConfigError


@dataclass
class MultimodalData:
    train: torch.utils.data.Dataset
    valid: torch.utils.data.Dataset | None
    tokenizer: object
    info: dict = field(default_factory=dict)

    @property
    def collate(self):
        return self.info["collate_fn"]


def prepare(llava: LlavaData, embeddings_per_tile: int, mock_data: bool, progress: bool = True) -> MultimodalData:
    """The train and held-out datasets of data/vision/section.py's ``LlavaData`` (``embeddings_per_tile``: the
    image embeddings of one tile, models/families/llava/flags.py)."""
    from mtmegatron.data.vision.build import build_multimodal_datasets

    if mock_data:
        raise ConfigError("--mock-data with --model llava: megatron-core's mock data has all-zero images, which "
                          "cannot show that the vision path learns anything; without --data-path the run uses the "
                          "embedded shapes dataset (generated images with questions about them, no network)")
    train, valid, tokenizer, info = build_multimodal_datasets(llava, embeddings_per_tile, progress=progress)
    if len(train) == 0:
        raise ConfigError("the multimodal training split is empty")
    return MultimodalData(train, valid, tokenizer, info)


def sample_tiles(dataset, index: int) -> list[int]:
    """Tiles per image of sample ``index`` from the loader's index (no image is read)."""
    if isinstance(dataset, torch.utils.data.Subset):
        return sample_tiles(dataset.dataset, dataset.indices[index])
    return list(dataset.entries[index][3])


def sample_load(dataset, index: int) -> int:
    """Text tokens + vision patches of sample ``index`` from the loader's index (no image is read)."""
    if isinstance(dataset, torch.utils.data.Subset):
        return sample_load(dataset.dataset, dataset.indices[index])
    return dataset.loads[index]


def balance_summary(dataset, reading: VisionReading, plan: SamplePlan, batches: int = 50) -> str:
    """The start-up line of ``--balance-micro-batches``: max/mean load per micro-batch and per DP rank over the
    first ``batches`` global batches of ``plan``, contiguous slices vs balanced."""
    from mtmegatron.data.vision.micro_batch_balance import balance, contiguous, peak_to_mean

    reader = MicroBatches(dataset.dataset, dataset.collate, reading, 0, plan, shuffle=dataset.shuffle)
    dp, mbs, before, after, seen = plan.data_parallel_size, plan.batches.micro_batch_size, [], [], 0
    for batch in plan:
        if seen == batches:
            break
        if batch.skipped:
            continue
        loads = [sample_load(reader.dataset, reader.sample_index(p)) for p in range(batch.first, batch.first + batch.size)]
        before.append(peak_to_mean(loads, contiguous(len(loads), dp, mbs)))
        after.append(peak_to_mean(loads, balance(loads, dp, mbs)))
        seen += 1

    def mean(pairs, k):
        return sum(p[k] for p in pairs) / len(pairs) if pairs else 1.0

    return (f"micro-batches balanced by load (text tokens + vision patches), mean over the first {seen} global "
            f"batches of max/mean: per micro-batch {mean(before, 0):.2f} -> {mean(after, 0):.2f}, per DP rank "
            f"{mean(before, 1):.2f} -> {mean(after, 1):.2f}")


class MicroBatches:
    """This DP rank's collated micro-batches for iterations ``start+1, start+2, ...`` (an iterator).

    ``shuffle``: the training order (a seeded permutation per epoch) instead of file order. ``blank_images``:
    every image replaced by a blank one (all zeros after normalization: the encoder's mean colour) — the
    text-only baseline of the held-out loss."""

    def __init__(self, dataset, collate, reading: VisionReading, dp_rank: int, plan: SamplePlan, shuffle: bool,
                 blank_images: bool = False):
        self.dataset, self.collate, self.shuffle, self.blank_images = dataset, collate, shuffle, blank_images
        self.reading, self.plan, self.seed, self.dp_rank = reading, plan, reading.seed, dp_rank
        self._orders: dict[int, np.ndarray] = {}
        self._extents = iter(plan)  # the global batches in order, for image_tokens
        self._batches = self._generate()

    def sample_index(self, position: int) -> int:
        """Dataset index of the ``position``-th sample the run reads."""
        n = len(self.dataset)
        epoch, offset = divmod(position, n)
        if not self.shuffle:
            return offset
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([self.seed, epoch]).permutation(n)}
        return int(self._orders[epoch][offset])

    def image_tokens(self, iteration: int) -> int:
        """Image embeddings in global batch ``iteration`` (1-based), summed over all its samples."""
        batch = next(b for b in self._extents if b.iteration == iteration)
        first, size = batch.first, batch.size
        tiles = sum(sum(sample_tiles(self.dataset, self.sample_index(p))) for p in range(first, first + size))
        return tiles * self.collate.img_seq_len

    def _positions(self):
        """This rank's micro-batches as run positions: its contiguous slice of each global batch, or with
        ``--balance-micro-batches`` its share of the balanced assignment (data/vision/micro_batch_balance.py)."""
        from mtmegatron.data.vision.micro_batch_balance import balance
        from mtmegatron.data.position import rank_micro_batches

        if not self.reading.balance_micro_batches:
            yield from (positions for _, positions in rank_micro_batches(self.plan, self.dp_rank))
            return
        for batch in self.plan:
            if batch.skipped:
                continue
            positions = list(range(batch.first, batch.first + batch.size))
            loads = [sample_load(self.dataset, self.sample_index(p)) for p in positions]
            dp, mbs = self.plan.data_parallel_size, self.plan.batches.micro_batch_size
            for micro in balance(loads, dp, mbs)[self.dp_rank]:
                yield [positions[i] for i in micro]

    def _generate(self):
        for positions in self._positions():
            samples = [self.dataset[self.sample_index(p)] for p in positions]
            batch = self.collate(samples)
            if self.blank_images:
                batch["images"] = torch.zeros_like(batch["images"])
            yield batch

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return next(self._batches)


def micro_batches(dataset, reading: VisionReading, dp_rank: int, plan: SamplePlan,
                  blank_images: bool = False) -> MicroBatches:
    """A vision task's micro-batches: ``dataset`` is a ``Split`` (train or valid); ``plan`` its global batches
    (data/position.py's SamplePlan)."""
    return MicroBatches(dataset.dataset, dataset.collate, reading, dp_rank, plan,
                        shuffle=dataset.shuffle, blank_images=blank_images or dataset.blank_images)


@dataclass(frozen=True)
class VisionReader:
    """The micro-batch reader of the vision tasks (a Step's ``micro_batches``, called as training/data.py's
    ``TextReader``): ``dataset`` a ``Split``, read from the global batches of data/position.py's SamplePlan."""
    batches: Batches
    data_parallel_size: int                             # megatron-core's parallel state (= config/'s)
    reading: VisionReading

    def __call__(self, dataset, dp_rank: int, start_iteration: int = 0, consumed: int | None = None,
                 validation: bool = False, valid_set: int | None = None) -> MicroBatches:
        plan = SamplePlan(self.batches, self.data_parallel_size, start_iteration, consumed, validation)
        return micro_batches(dataset, self.reading, dp_rank, plan)


@dataclass
class Split:
    """A dataset with what ``micro_batches`` needs to read it: its collate function and order."""
    dataset: torch.utils.data.Dataset
    collate: object
    shuffle: bool
    blank_images: bool = False

    def __len__(self) -> int:
        return len(self.dataset)

    def blanked(self) -> "Split":
        return Split(self.dataset, self.collate, self.shuffle, blank_images=True)
