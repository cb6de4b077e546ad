"""What a finished native-resolution vision-language run (``--model qwen2-vl|qwen2.5-vl`` on conversations:
tasks/qwen_vl/data.py) says about its held-out answers: ``<log-dir>/answer_eval.json`` with the held-out
answer accuracy, the share of held-out samples whose every answer token (the closing ``<|im_end|>`` included) is the
model's greedy choice given the conversation up to it (teacher-forced argmax, one forward pass per micro-batch).

It reads the whole held-out set, ``len // --global-batch-size`` global batches in file order (the last partial one
left out, as ``--full-validation`` does), through megatron-core's forward-only schedule with the forward step of
``tasks/qwen_vl/step.py`` minus the labels (the model returns logits, gathered over TP), so it works at every
TP/PP/DP layout; the last pipeline stage counts, the count is summed over data-parallel ranks.
The values read are the run's ``Schedule`` (training/section.py; the micro-batch count as train_step.py derives
it) and tasks/section.py's ``VisionOutputs``; the held-out set is read by the task's ``VisionReader``.
May assume: called on every rank after the last iteration (the schedule is collective); rank 0 writes.
"""

from __future__ import annotations

import json
import os
from functools import partial

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.utils import get_attr_wrapped_model

from mtmegatron.backends.device import compute_device, to_compute_device
from mtmegatron.tasks.llava.data import Split, VisionReader
from mtmegatron.tasks.qwen_vl.step import VISION
from mtmegatron.tasks.section import VisionOutputs
from mtmegatron.training.section import Schedule
from mtmegatron.training.train_step import micro_batches_per_step
from mtmegatron.utils.metrics import print_rank0


def _count_correct(labels: torch.Tensor, loss_mask: torch.Tensor, logits: torch.Tensor):
    """(a zero loss, {"correct", "samples"}) of one micro-batch: samples whose answer tokens are all argmax."""
    wrong = (logits.argmax(-1) != labels) & (loss_mask > 0)
    correct = (~wrong.any(-1)).sum()
    zero = logits.new_zeros(())
    return zero, {"correct": correct.detach(), "samples": torch.tensor(labels.shape[0], device=labels.device)}


def _forward_step(data_iterator, model):
    batch = next(data_iterator)
    encoder = get_attr_wrapped_model(model, "add_encoder")
    vision = {}
    for pixels, grid in VISION:
        if encoder and batch[pixels].numel():
            vision[pixels], vision[grid] = batch[pixels], batch[grid]
    batch = to_compute_device({"tokens": batch["tokens"], "position_ids": batch["position_ids"],
                               "labels": batch["labels"], "loss_mask": batch["loss_mask"], **vision})
    logits = model(batch["tokens"], batch["position_ids"], None, runtime_gather_output=True,
                   **{key: batch[key] for key in vision})
    return logits, partial(_count_correct, batch["labels"], batch["loss_mask"])


def answer_accuracy(model, valid, schedule: Schedule, reader: VisionReader) -> dict:
    """``{"answer_accuracy", "held_out_samples"}`` over the held-out ``multimodal_data.Split`` ``valid``."""
    num_batches = len(valid) // schedule.global_batch_size
    dp_rank = parallel_state.get_data_parallel_rank()
    iterators = [reader(valid, dp_rank, validation=True) for _ in model]
    counts = torch.zeros(2, dtype=torch.float64, device=compute_device())
    is_reporter = (parallel_state.is_pipeline_last_stage(ignore_virtual=True)
                   and parallel_state.get_tensor_model_parallel_rank() == 0)
    for chunk in model:
        chunk.eval()
    with torch.no_grad():
        for _ in range(num_batches):
            reports = get_forward_backward_func()(
                forward_step_func=_forward_step, data_iterator=iterators if len(model) > 1 else iterators[0],
                model=model if len(model) > 1 else model[0], num_microbatches=micro_batches_per_step(schedule),
                seq_length=schedule.seq_length, micro_batch_size=schedule.micro_batch_size,
                decoder_seq_length=schedule.seq_length, forward_only=True)
            if is_reporter:
                for report in reports:
                    counts += torch.stack([report["correct"], report["samples"]]).to(counts)
    for chunk in model:
        chunk.train()
    torch.distributed.all_reduce(counts)
    correct, samples = counts.tolist()
    return {"answer_accuracy": correct / samples if samples else None, "held_out_samples": int(samples)}


def write_answer_eval(model, data, outputs: VisionOutputs, schedule: Schedule, reader: VisionReader) -> None:
    """``<log-dir>/answer_eval.json`` and one console line (nothing without a held-out set or with
    ``--eval-iters 0``, or under context parallelism: this scoring runs whole padded rows)."""
    if data.valid is None or schedule.eval_iters == 0 or len(data.valid) < schedule.global_batch_size:
        return
    if outputs.context_parallel_size > 1:
        print_rank0(torch.distributed.get_rank(), "mtmegatron: held-out answer accuracy not scored under "
                    "--context-parallel-size > 1 (the held-out loss is)")
        return
    padded = data.info.get("padded_collate_fn", data.collate)  # packed training batches: score padded rows
    held_out = Split(data.info.get("samples_valid", data.valid), padded, shuffle=False)
    result = answer_accuracy(model, held_out, schedule, reader)
    rank = torch.distributed.get_rank()
    if rank == 0:
        with open(os.path.join(outputs.log_dir, "answer_eval.json"), "w") as f:
            json.dump(result, f, indent=1)
    print_rank0(rank, f"mtmegatron: held-out answer accuracy {result['answer_accuracy']:.1%} of "
                f"{result['held_out_samples']} samples (every answer token the greedy choice)")
