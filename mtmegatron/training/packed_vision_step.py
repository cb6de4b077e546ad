"""The forward step of the native-resolution vision-language models (models/qwen_vl.py) for megatron-core's
pipeline schedules, on the padded batches of ``training/packed_vision_data.py``.

A micro-batch (``vision_samples.collate_padded``: tokens / labels / loss_mask ``[b, s]``, 3-D M-RoPE positions
``[3, b, s]``, every sample's patches concatenated with their grids) goes to the compute device and through
``NativeResolutionVLM``: the pixels and grids only on the chunk that holds the vision encoder (the first stage's
first chunk), positions on every stage (each applies its own rotary), labels on every stage (only the last reads
them). Ignored labels (-100, padding and prompt) become id 0 for the model's cross entropy; the loss mask (1
exactly at the answer tokens) removes them from the loss. Padding sits at the right of a causal model, so no
attention mask is needed. The loss is ``multimodal_step.loss_func``: mean over the micro-batch's answer tokens.
May assume: DDP-wrapped ``NativeResolutionVLM`` chunks; sequence parallelism and pipeline stages are the model's.
"""

from __future__ import annotations

from functools import partial

from megatron.core.utils import get_attr_wrapped_model

from mtmegatron.backends.device import to_compute_device
from mtmegatron.training.multimodal_step import loss_func

VISION = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


def forward_step(data_iterator, model):
    batch = next(data_iterator)
    encoder = get_attr_wrapped_model(model, "add_encoder")
    vision = {}
    for pixels, grid in VISION:  # a batch without images (videos) passes None: nothing for the encoder to run
        if encoder and batch[pixels].numel():
            vision[pixels], vision[grid] = batch[pixels], batch[grid]
    batch = to_compute_device({"tokens": batch["tokens"], "position_ids": batch["position_ids"],
                               "labels": batch["labels"].clamp(min=0), "loss_mask": batch["loss_mask"], **vision})
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                   **{key: batch[key] for key in vision})
    return output, partial(loss_func, batch["loss_mask"])
