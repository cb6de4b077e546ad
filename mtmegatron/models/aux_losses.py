"""Per-iteration MTP and MoE auxiliary losses for metrics.jsonl (``mtp_loss``, ``moe_aux_loss``, ``moe_z_loss``).

megatron-core accumulates them in trackers during the forward passes of one global batch: MTP per MTP layer
(``MTPLossLoggingHelper``, on the last pipeline stage), the MoE load-balancing loss and, with
``--moe-z-loss-coeff``, the router z-loss per MoE layer (the layer-wise aux-loss tracker, before their
coefficients; Megatron-LM's training log tracks the same names: ``load_balancing_loss``, ``z_loss``).
``aux_loss_stats`` reduces them the way Megatron-LM's training log does (mean over micro-batches and data-parallel
ranks; MoE: mean over MoE layers, MTP: mean over MTP layers), makes the numbers visible on every rank, and clears
the trackers for the next iteration.
It reads the ``AuxLosses`` section (models/section.py) and the run's micro-batches per global batch.
May assume: called once per iteration on every rank, after the forward/backward of all micro-batches.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from mtmegatron.backends.device import compute_device
from mtmegatron.models.section import AuxLosses

_AUX_NAMES = {"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss",
              "global_aux_loss": "global_load_balancing_loss"}


def _mtp_loss(num_microbatches: int) -> float:
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    tracker = MTPLossLoggingHelper.tracker
    contribution = torch.zeros(1, dtype=torch.float64, device=compute_device())  # goes through a collective
    if "values" in tracker:  # ranks holding the MTP block
        MTPLossLoggingHelper.reduce_loss_in_tracker()  # average over data-parallel ranks
        if (parallel_state.get_tensor_model_parallel_rank() == 0
                and parallel_state.get_data_parallel_rank(with_context_parallel=True) == 0):  # one copy
            contribution += tracker["values"].double().mean() / num_microbatches
        MTPLossLoggingHelper.clean_loss_in_tracker()
    torch.distributed.all_reduce(contribution)
    return contribution.item()


def _moe_losses(aux: AuxLosses, num_microbatches: int, names: dict[str, str]) -> dict:
    """megatron-core's tracker name -> our row key, one ``track_moe_metrics`` call (it reduces and clears them)."""
    from megatron.core.transformer.moe.moe_utils import track_moe_metrics

    totals: dict = {}
    track_moe_metrics(loss_scale=1.0 / num_microbatches, iteration=0, total_loss_dict=totals,
                      force_initialize=True, track_names=list(names),
                      num_layers=aux.num_layers + (aux.mtp_num_layers or 0),
                      moe_layer_freq=aux.moe_layer_freq, mtp_num_layers=aux.mtp_num_layers)
    return {key: float(totals[name]) for name, key in names.items()}


def aux_loss_stats(aux: AuxLosses, num_microbatches: int) -> dict:
    """``{"mtp_loss": ..., "moe_aux_loss": ..., "moe_z_loss": ...}`` for the features this run has (empty when
    none); ``num_microbatches``: the micro-batches of the global batch (their mean)."""
    stats = {}
    if aux.mtp_num_layers:
        stats["mtp_loss"] = _mtp_loss(num_microbatches)
    names = {}
    if aux.num_experts and aux.moe_router_load_balancing_type in _AUX_NAMES and aux.moe_aux_loss_coeff:
        names[_AUX_NAMES[aux.moe_router_load_balancing_type]] = "moe_aux_loss"
    if aux.num_experts and aux.moe_z_loss_coeff is not None:  # Megatron-LM's condition
        names["z_loss"] = "moe_z_loss"
    if names:
        stats.update(_moe_losses(aux, num_microbatches, names))
    return stats
