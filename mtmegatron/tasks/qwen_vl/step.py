"""The forward step of the native-resolution vision-language models (models/families/qwen2_vl/model.py) for megatron-core's
pipeline schedules, on the padded batches of ``tasks/qwen_vl/data.py``.

A micro-batch (``qwen_vl_samples.collate_padded``: tokens / labels / loss_mask ``[b, s]``, 3-D M-RoPE positions
``[3, b, s]``, every sample's patches concatenated with their grids) goes to the compute device and through
``NativeResolutionVLM``: the pixels and grids only on the chunk that holds the vision encoder (the first stage's
first chunk), positions on every stage (each applies its own rotary), labels on every stage (only the last reads
them). Ignored labels (-100, padding and prompt) become id 0 for the model's cross entropy; the loss mask (1
exactly at the answer tokens) removes them from the loss. Padding sits at the right of a causal model, so no
attention mask is needed. The loss is ``multimodal_step.loss_func``: mean over the micro-batch's answer tokens.
Packed micro-batches (``--vision-packing thd``: one THD row of bins, tasks/qwen_vl/thd.py) go with megatron-core's
``PackedSeqParams`` (sft_step.packed_seq_params): attention per conversation, the same mean over the same answer
tokens as ``--vision-packing padded`` (the same bins as padded rows). Context parallelism: every CP rank gets the whole micro-batch, the model merges the vision embeddings into
the whole sequence and keeps this rank's positions (``cp_positions``: load-balanced chunks of a padded row, each
conversation's chunks of a THD row); labels and loss mask are cut the same way here, and so are the 3-D positions
of a padded row (a THD row's stay whole: megatron-core's THD RoPE picks each sequence's chunks by offset). The loss
is then ``cp_loss``: this rank's answer-token loss sum over the micro-batch's answer-token count.
``vision_step(packing, padded_rows, reader)``: this forward step, that shape and the reader of ``tasks/llava/data.py``
(``VisionReader``; training's Step).
May assume: DDP-wrapped ``NativeResolutionVLM`` chunks; sequence parallelism and pipeline stages are the model's.
"""

from __future__ import annotations

from functools import partial

from megatron.core import parallel_state
from megatron.core.utils import get_attr_wrapped_model

from mtmegatron.attention.cp_batch import cp_loss
from mtmegatron.backends.device import to_compute_device
from mtmegatron.tasks.llava.data import VisionReader
from mtmegatron.tasks.llava.step import loss_func
from mtmegatron.tasks.qwen_vl.section import Packing
from mtmegatron.tasks.qwen_vl.thd import cp_positions
from mtmegatron.training.sft_step import packed_seq_params
from mtmegatron.training.train_step import Step

VISION = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


THD_KEYS = ("cu_seqlens", "cu_seqlens_padded", "max_seqlen")


def cp_loss_func(loss_mask, output_tensor):
    """The micro-batch's answer-token mean when its tokens are spread over the CP group (attention/cp_batch.py)."""
    return cp_loss(output_tensor.float().reshape(-1), loss_mask.reshape(-1).float())


def schedule_shape(packing: Packing, padded_rows: int | None) -> tuple[int, int]:
    """(seq_length, micro_batch_size) of the pipeline schedule: a THD micro-batch is one row of mbs x seq, padded
    bins ``padded_rows`` rows (tasks/qwen_vl/thd.py's ``binned``)."""
    if packing.vision_packing == "thd":
        return packing.micro_batch_size * packing.seq_length, 1
    return packing.seq_length, padded_rows if packing.vision_packing == "padded" else packing.micro_batch_size


def forward_step(data_iterator, model):
    batch = next(data_iterator)
    encoder = get_attr_wrapped_model(model, "add_encoder")
    vision = {}
    for pixels, grid in VISION:  # a batch without images (videos) passes None: nothing for the encoder to run
        if encoder and batch[pixels].numel():
            vision[pixels], vision[grid] = batch[pixels], batch[grid]
    batch = to_compute_device({"tokens": batch["tokens"], "position_ids": batch["position_ids"],
                               "labels": batch["labels"].clamp(min=0), "loss_mask": batch["loss_mask"], **vision,
                               **{key: batch[key] for key in THD_KEYS if key in batch}})
    labels, loss_mask, positions, extra = batch["labels"], batch["loss_mask"], batch["position_ids"], {}
    cp_size, loss = parallel_state.get_context_parallel_world_size(), loss_func
    if cp_size > 1:
        index = cp_positions(batch, cp_size, parallel_state.get_context_parallel_rank()).to(labels.device)
        labels, loss_mask, loss = labels.index_select(1, index), loss_mask.index_select(1, index), cp_loss_func
        if "cu_seqlens" not in batch:
            positions = positions.index_select(2, index)
        extra["cp_positions"] = index
    output = model(batch["tokens"], positions, None, labels=labels, packed_seq_params=packed_seq_params(batch),
                   **extra, **{key: batch[key] for key in vision})
    return output, partial(loss, loss_mask)


def vision_step(packing: Packing, padded_rows: int | None, reader: VisionReader) -> Step:
    """What the schedule runs for the packed-vision task (training/train_step.py's Step), reading with
    ``reader``."""
    return Step(forward_step, shape=schedule_shape(packing, padded_rows), micro_batches=reader)
