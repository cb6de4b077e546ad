"""The values training/resilience/ reads: Megatron-LM's result validation, run control on signals and time
limits, the weight-hash check and the process-group timeout after the first iteration. Filled once per run by
``Resilience.of(args)`` (training/loop.py; the checkpoint's rerun calls), compared by value.
May assume: the flags were parsed and checked (config/resilience_flags.py, config/run_control.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Resilience(Section):
    rerun_mode: str                                             # "validate_results" | "disabled" (rerun.py)
    error_injection_rate: int                                   # megatron-core's RerunErrorInjector: 1 in N
    error_injection_type: str                                   # "correct_result" | "transient_error" | ...
    result_rejected_tracker_filename: str | None                # megatron-core's log of rejected results
    check_for_nan_in_loss_and_grad: bool                        # validate each loss for NaN/Inf
    check_for_spiky_loss: bool                                  # validate each loss against 10x the largest
    exit_signal_handler: bool                                   # install the handler for exit_signal
    exit_signal: str                                            # signal.Signals member's name ("SIGTERM")
    exit_duration_in_mins: int | None                           # stop after this many minutes (0/None: never)
    check_weight_hash_across_dp_replicas_interval: int | None   # every N iterations (None: never)
    distributed_timeout_seconds_after_init: int | None          # process-group timeout after iteration 1
