"""The forward step and loss of SFT (and of any run with ``--calculate-per-token-loss``).

A packed batch (it carries ``cu_seqlens``) goes to the model as THD with megatron-core's ``PackedSeqParams``:
attention stays inside each sequence and RoPE restarts at every sequence start. Under context parallelism the
packed row carries ``cu_seqlens_padded`` (each conversation padded to a multiple of 2 x CP, packing.py) and
is cut per sequence (cp_batch.py's THD split); ``PackedSeqParams`` gets the global real and padded
``cu_seqlens`` as megatron-core's THD CP path expects. The loss function returns
megatron-core's per-token triple ``(loss sum, loss-token count, report)``; with
``config.calculate_per_token_loss`` the schedule leaves the sum undivided, ``finalize_model_grads`` divides
the gradients by the token count all-reduced over the pipeline's last stage and DP x CP, and the report's
``[sum, count]`` is summed the same way by ``global_per_token_loss``. So the loss and gradient are the mean
over every loss token of the global batch, however the batch is cut into micro-batches or packed.
May assume: megatron-core 0.16 schedules; parallel state initialised.
"""

from __future__ import annotations

from functools import partial

import torch
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams

from mtmegatron.attention.cp_batch import batch_on_this_cp_rank
from mtmegatron.training.resilience import rerun
from mtmegatron.backends.device import compute_device, to_compute_device
from mtmegatron.sft.section import Sft


SUM_AND_COUNT = "lm loss sum, tokens"


def packed_seq_params(batch: dict) -> PackedSeqParams | None:
    if "cu_seqlens" not in batch:
        return None
    cu, longest, padded = batch["cu_seqlens"], int(batch["max_seqlen"]), batch.get("cu_seqlens_padded")
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=padded,
                           cu_seqlens_kv_padded=padded, max_seqlen_q=longest, max_seqlen_kv=longest)


def per_token_loss(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    total = rerun.validate_loss(torch.sum(losses * mask))  # pretrain_gpt's checks (training/resilience/rerun.py)
    count = mask.sum()
    report = torch.stack([total.detach(), count]).double()
    # "lm loss": this micro-batch's mean (read by the inf/nan check); the global mean comes from the sums
    return total, count.to(torch.int), {"lm loss": report[0] / report[1].clamp(min=1), SUM_AND_COUNT: report}


def forward_step(data_iterator, model):
    batch = batch_on_this_cp_rank(to_compute_device(next(data_iterator)))
    params = packed_seq_params(batch)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"], packed_seq_params=params)
    return output, partial(per_token_loss, batch["loss_mask"])


def global_per_token_loss(losses_reduced: list[dict]) -> float:
    """Loss sum over loss-token count of the whole global batch, the same on every rank."""
    totals = torch.zeros(2, dtype=torch.float64, device=compute_device())
    if (parallel_state.is_pipeline_last_stage(ignore_virtual=True)
            and parallel_state.get_tensor_model_parallel_rank() == 0):
        for report in losses_reduced:
            totals += report[SUM_AND_COUNT].to(totals.device)
    torch.distributed.all_reduce(totals)  # every DP x CP replica of the last stage's TP rank 0
    return (totals[0] / totals[1].clamp(min=1)).item()


def schedule_shape(sft: Sft, padded_rows: int) -> tuple[int, int]:
    """(seq_length, micro_batch_size) the pipeline schedule sizes its activations with: a packed micro-batch
    is one THD row of ``mbs * seq_length`` tokens; a padded one has ``padded_rows`` rows (sft/prepare.py's)."""
    if sft.sft_packing:
        return sft.micro_batch_size * sft.seq_length, 1
    return sft.seq_length, padded_rows
