"""The forward step of ``--model llava`` for megatron-core's pipeline schedules, and its loss.

One micro-batch (``data/vision/llava_collate.py``'s contract) goes to the compute device and through
``LLaVAModel``: images only on the chunk that holds the vision encoder (the first pipeline stage's first
chunk; other stages would only hold them in memory), tokens with one ``-200`` per image, the text-coordinate
labels and loss mask, and the tiles per image. The model expands labels and loss mask to the combined
image+text sequence (image positions and the position before each image masked) and returns the per-token
loss with that expanded mask: the loss is taken over exactly the mask the model returns, never over the
text-coordinate mask. On stages without the output layer the model returns hidden states and no mask.

Loss: mean over the micro-batch's answer tokens, as ``train_step.loss_func`` for text (megatron-core divides by
the number of micro-batches). Context parallelism is refused for LLaVA (``models/families/llava/flags.py``).
``llava_step(reader)``: this forward step with the reader of ``tasks/llava/data.py`` (``VisionReader``) and the
``image_tokens`` metric.
May assume: DDP-wrapped ``LLaVAModel`` chunks (models/families/llava/model.py); batches from ``tasks/llava/data.py``.
"""

from __future__ import annotations

from functools import partial

import torch
from megatron.core.utils import get_attr_wrapped_model

from mtmegatron.backends.device import to_compute_device
from mtmegatron.tasks.llava.data import VisionReader
from mtmegatron.training.train_step import Step


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    # reshape, not view: when a micro-batch's samples hold different numbers of image tiles, LLaVAModel cuts the
    # combined sequence back to --decoder-seq-length by slicing, and the mask it returns is not contiguous
    losses = output_tensor.float().reshape(-1)
    mask = loss_mask.reshape(-1).float()
    assert losses.numel() == mask.numel(), f"per-token loss {tuple(output_tensor.shape)} vs mask {tuple(loss_mask.shape)}"
    loss = torch.sum(losses * mask) / mask.sum()
    return loss, {"lm loss": loss.detach().clone()}


def forward_step(data_iterator, model):
    batch = next(data_iterator)
    if not get_attr_wrapped_model(model, "add_encoder"):
        batch.pop("images")  # only the encoder's chunk reads pixels
    batch = to_compute_device(batch)
    output, loss_mask = model(
        batch.get("images"), batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
        loss_mask=batch["loss_mask"], num_image_tiles=batch["num_image_tiles"])
    return output, partial(loss_func, loss_mask)


def image_tokens(data_iterators, iteration: int) -> dict:
    """The metrics row's ``image_tokens``: image embeddings of global batch ``iteration`` (data.py)."""
    return {"image_tokens": data_iterators[0].image_tokens(iteration)}


def llava_step(reader: VisionReader) -> Step:
    """What the schedule runs for ``--model llava`` (training/train_step.py's Step), reading with ``reader``."""
    return Step(forward_step, micro_batches=reader, stats=image_tokens, loss_validated=False)
