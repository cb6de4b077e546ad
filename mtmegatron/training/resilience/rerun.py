"""Megatron-LM's result validation: megatron-core's ``RerunStateMachine`` wired as Megatron-LM core_v0.16.1 wires
it (initialize.py, training.py's train_step, pretrain_gpt.py's loss_func — here the text and SFT losses;
LLaVA's, as pretrain_vlm.py's, is not validated —, checkpointing.py).

``--rerun-mode`` (Megatron-LM's default ``validate_results``): each micro-batch loss is validated — NaN and Inf
with ``--check-for-nan-in-loss-and-grad`` (default on; megatron-core's DDP validates each gradient bucket's norm
the same way), a loss 10x above the largest of the first 100 seen with ``--check-for-spiky-loss`` —, from the
second step of a run on (the machine validates nothing before one optimizer step is done). A rejected result
makes the step run again in place, from the same RNG states and the same micro-batches (``RerunDataIterator``):
- not reproduced (a transient fault): a spiky loss goes on with the re-run's gradients; a NaN/Inf stops the run
  with status 17 (``EXIT_CODE_FAILED_ON_RESULT_VALIDATION``) after saving a checkpoint (with ``--save``);
- reproduced: a spiky loss goes on; a NaN/Inf saves a checkpoint of the state before the step (with the
  machine's state and the step's micro-batches) and stops with status 16 (``EXIT_CODE_RESUME_TO_DISAMBIGUATE``):
  resumed on another device, the step is run a third time to tell a faulty device from a correct result.
``report_stats`` is refused (config/resilience_flags.py: megatron-core 0.16.1 cannot run it).
``disabled``: validations still run and a rejected NaN/Inf raises (megatron-core's behaviour).
``--error-injection-rate``/``--error-injection-type`` feed megatron-core's ``RerunErrorInjector``;
``--result-rejected-tracker-filename`` its log of rejected results.
Test hook: ``MTMEGATRON_TEST_INJECT_LOSS=ITER:spike|nan:once|always[:RANK]`` multiplies that rank's (default 0;
a rank that computes the loss) first micro-batch loss of step ITER by 1000 (or by NaN) before validation and
backward, in the first run of the step only (``once``: a transient fault) or in every run of it (``always``: a
persistent one).
The entries that read flags take the run's ``Resilience`` section (training/resilience/section.py); the machine is made again
only for a section of other values (sections compare by value), never for an equal one.
May assume: megatron-core's parallel state; the bridge makes the machine's CUDA calls (RNG states, device index)
resolve to the backend.
"""

from __future__ import annotations

import os
from functools import partial

import torch
from megatron.core import tensor_parallel
from megatron.core.rerun_state_machine import (EXIT_CODE_FAILED_ON_RESULT_VALIDATION,
                                               EXIT_CODE_RESUME_TO_DISAMBIGUATE, RerunDataIterator,
                                               RerunDiagnostic, RerunErrorInjector, RerunMode, RerunState,
                                               destroy_rerun_state_machine, get_rerun_state_machine,
                                               initialize_rerun_state_machine)

from mtmegatron.training.resilience.section import Resilience

SPIKY_LOSS_FACTOR = 10  # Megatron-LM's pretrain_gpt.py
MODES = {"disabled": RerunMode.DISABLED, "validate_results": RerunMode.VALIDATE_RESULTS}
EXIT_MEANINGS = {
    EXIT_CODE_RESUME_TO_DISAMBIGUATE: "the rejected result was reproduced: resume from the checkpoint on another "
                                      "device to re-run the step there",
    EXIT_CODE_FAILED_ON_RESULT_VALIDATION: "result validation failed",
}
INJECT_ENV = "MTMEGATRON_TEST_INJECT_LOSS"

_section = None       # the values the machine was made from (a Resilience)
_iterators = None     # the replayable iterators of the step in progress (saved with a rerun checkpoint)


def machine(resilience: Resilience):
    """The process's rerun state machine, made once per section value (again only for a run with other values
    in this process: an equal section, however built, keeps the machine and its state)."""
    global _section
    if _section != resilience:
        destroy_rerun_state_machine()
        initialize_rerun_state_machine(
            state_save_func=lambda: {"rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()},
            state_restore_func=_restore_tracker,
            mode=MODES[resilience.rerun_mode],
            error_injector=RerunErrorInjector(error_injection_rate=resilience.error_injection_rate,
                                              error_injection_type=RerunDiagnostic(resilience.error_injection_type)),
            result_rejected_tracker_filename=resilience.result_rejected_tracker_filename,
        )
        _section = resilience
    return get_rerun_state_machine()


def _restore_tracker(state: dict) -> None:
    if state["rng_tracker_states"]:
        tensor_parallel.get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


def describe(resilience: Resilience, loss_validated: bool) -> str:
    """The start-up line: what the mode does in this run (``loss_validated``: the task's Step says; False for
    LLaVA's)."""
    checks = [name for name, on in (("NaN/Inf loss and gradients", resilience.check_for_nan_in_loss_and_grad),
                                    ("spiky loss (10x)", resilience.check_for_spiky_loss)) if on]
    what = " and ".join(checks) or "nothing (no check asked for)"
    if not loss_validated and checks:  # as Megatron-LM's pretrain_vlm: its loss is not validated
        what = f"{what} (LLaVA: gradients only, as Megatron-LM's pretrain_vlm)"
    if resilience.rerun_mode == "disabled":
        return f"mtmegatron: --rerun-mode disabled: validates {what}; a NaN/Inf raises, nothing is re-run"
    return (f"mtmegatron: --rerun-mode validate_results: validates {what} from the second step on; a rejected "
            f"result re-runs the step (transient: spiky loss goes on, NaN/Inf exits 17; reproduced: spiky loss goes "
            f"on, NaN/Inf saves and exits 16)")


def start(resilience: Resilience, start_iteration: int):
    """Before the first step: the machine counts steps as the loop does (Megatron-LM sets it after a load)."""
    rerun = machine(resilience)
    rerun.current_iteration = start_iteration
    return rerun


def replayable(data_iterators: list) -> list:
    """The step's iterators, wrapped so the machine can replay the step's micro-batches."""
    global _iterators
    _iterators = [None if it is None else RerunDataIterator(it) for it in data_iterators]
    return _iterators


def validate_loss(loss: torch.Tensor) -> torch.Tensor:
    """pretrain_gpt.py's checks of one micro-batch loss (inside a training step only: evaluation runs no step);
    returns the loss (the test hook may have faulted it)."""
    rerun = get_rerun_state_machine()
    if _section is None or rerun.state == RerunState.NOT_RUNNING_YET:
        return loss
    loss = _inject(loss, rerun)
    result = loss.detach().clone()  # the machine keeps it; the schedule divides the loss in place
    if _section.check_for_nan_in_loss_and_grad:
        rerun.validate_result(result=result, rejection_func=torch.isnan,
                              message="found NaN in local forward loss calculation", tolerance=0.0, fatal=True)
        rerun.validate_result(result=result, rejection_func=torch.isinf,
                              message="found Inf in local forward loss calculation", tolerance=0.0, fatal=True)
    if _section.check_for_spiky_loss:
        rerun.validate_result(result=result, rejection_func=partial(rerun.is_unexpectedly_large,
                                                                  threshold=SPIKY_LOSS_FACTOR, context="loss"),
                              message="Spiky loss", tolerance=0.0, fatal=False)
    return loss


_injected_at = None  # (iteration, state) of the last injection: only the step's first micro-batch is faulted


def _inject(loss: torch.Tensor, rerun) -> torch.Tensor:
    global _injected_at
    spec = os.environ.get(INJECT_ENV)
    if not spec:
        return loss
    iteration, kind, when, rank = (spec + ":0").split(":")[:4]
    if torch.distributed.get_rank() != int(rank):
        return loss
    if rerun.current_iteration != int(iteration) or _injected_at == (rerun.current_iteration, rerun.state):
        return loss
    if when == "once" and rerun.state != RerunState.INITIAL_RUN:
        return loss
    _injected_at = (rerun.current_iteration, rerun.state)
    return loss * (1000.0 if kind == "spike" else float("nan"))


def checkpoint_state(resilience: Resilience) -> dict | None:
    """What a checkpoint keeps of the machine: only while a step waits to be re-run (Megatron-LM's rule)."""
    return machine(resilience).state_dict(data_iterator=_iterators, ckpt_format="torch_dist")


def load_template(resilience: Resilience, common: dict, same_layout: bool, finetune: bool) -> dict | None:
    """The sharded template to load a saved machine state with, when the checkpoint holds one this run can use
    (same world size and layout, not ``finetune`` (--finetune), mode not disabled)."""
    saved = common.get("rerun_state_machine")
    rerun = machine(resilience)
    if (not same_layout or finetune or rerun.get_mode() == RerunMode.DISABLED
            or not rerun.validate_state_dict(saved)):
        return None
    return rerun.state_dict(data_iterator=None, ckpt_format="torch_dist", force=True)


def restore(resilience: Resilience, loaded: dict) -> None:
    machine(resilience).load_state_dict(loaded)


def exit_message(exit_code: int, iteration: int, save_asked: bool, saved: str | None) -> str:
    """The loop's last line when the machine stops the run (``save_asked``: the machine asked for a checkpoint;
    it does not when resumed from the one it asked for)."""
    where = (f"; saved {saved} (the state before step {iteration})" if saved
             else " (no --save: nothing saved)" if save_asked else "")
    return (f"mtmegatron: rerun: step {iteration}: {EXIT_MEANINGS.get(exit_code, 'stopping')}{where}; "
            f"exiting with status {exit_code}")
