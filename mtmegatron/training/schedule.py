"""The LR / weight-decay schedule of a run, and Megatron-LM's rule for resuming with a different one.

``build_scheduler`` makes megatron-core's ``OptimizerParamScheduler`` from the flags (steps count samples, as
in Megatron-LM: iterations x global batch, or the ``--*-samples`` values of sample-based training; the step
counts, WSD and the weight-decay schedule come from training/schedule_steps.py; ``--lr-decay-iters`` defaults
to ``--train-iters``, so changing ``--train-iters`` changes the schedule). ``check_schedule`` runs on ``--load``
before the scheduler state is restored: if the checkpoint's schedule (max/min lr, warmup steps, decay steps,
decay style, start/end weight decay, weight-decay increment style and steps — the values megatron-core's
scheduler compares) differs from this run's, the load stops with one message unless the user chose:
``--override-opt_param-scheduler`` (this run's flags, continued from the checkpoint's step count) or
``--use-checkpoint-opt_param-scheduler`` (the checkpoint's values). Giving both is a flag error
(``schedule_flags.check_schedule_args``). ``wd_incr_steps`` is not compared when both sides keep the
weight decay constant (it has no effect then). ``--finetune`` / ``--no-load-optim`` never restore a schedule.
May assume: the schedule flags validated by config/schedule_flags.py.
"""

from __future__ import annotations

from mtmegatron.training.schedule_steps import scheduler_steps, weight_decay_range
from mtmegatron.training.section import LrSchedule

# scheduler state key -> the flag that sets it
COMPARED = {
    "max_lr": "--lr", "min_lr": "--min-lr",
    "lr_warmup_steps": "--lr-warmup-iters|samples|fraction",
    "lr_decay_steps": "--lr-decay-iters|samples (default --train-iters|samples)", "lr_decay_style": "--lr-decay-style",
    "start_wd": "--weight-decay / --start-weight-decay", "end_wd": "--weight-decay / --end-weight-decay",
    "wd_incr_style": "--weight-decay-incr-style", "wd_incr_steps": "--train-iters|samples",
}
_STEP_KEYS = ("lr_warmup_steps", "lr_decay_steps", "wd_incr_steps")


def build_scheduler(optimizer, schedule: LrSchedule):
    """megatron-core's ``OptimizerParamScheduler`` for the flags, with Megatron-LM's step counts."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    start_wd, end_wd = weight_decay_range(schedule)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=schedule.lr_warmup_init,
        max_lr=schedule.lr,
        min_lr=schedule.min_lr,
        lr_decay_style=schedule.lr_decay_style,
        start_wd=start_wd,
        end_wd=end_wd,
        wd_incr_style=schedule.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=schedule.use_checkpoint_opt_param_scheduler,
        override_opt_param_scheduler=schedule.override_opt_param_scheduler,
        lr_wsd_decay_style=schedule.lr_wsd_decay_style,
        **scheduler_steps(schedule),  # lr_warmup_steps, lr_decay_steps, wsd_decay_steps, wd_incr_steps
    )


def schedule_differences(saved: dict, current: dict) -> dict:
    """``{key: (checkpoint value, run value)}`` over the compared keys present in ``saved``."""
    keys = [k for k in COMPARED if k in saved]
    if saved.get("wd_incr_style") == current.get("wd_incr_style") == "constant":
        keys = [k for k in keys if k != "wd_incr_steps"]
    return {k: (saved[k], current[k]) for k in keys if saved[k] != current[k]}


def loadable_state(saved: dict, scheduler) -> dict:
    """``saved`` with ``wd_incr_steps`` taken from ``scheduler`` where it is not compared (constant weight decay
    on both sides), so megatron-core's own load-time equality check agrees with ``schedule_differences``."""
    current = scheduler.state_dict()
    if saved.get("wd_incr_style") == current["wd_incr_style"] == "constant":
        return {**saved, "wd_incr_steps": current["wd_incr_steps"]}
    return saved


def _describe(key: str, value, gbs: int) -> str:
    if key in _STEP_KEYS and gbs and value % gbs == 0:
        return f"{value // gbs} iterations"
    return str(value)


def check_schedule(saved: dict, scheduler, schedule: LrSchedule, directory: str, error=ValueError) -> None:
    """Raise ``error`` when the saved schedule differs and no flag says which one to use."""
    differences = schedule_differences(saved, scheduler.state_dict())
    if not differences or schedule.override_opt_param_scheduler or schedule.use_checkpoint_opt_param_scheduler:
        return
    gbs = schedule.global_batch_size
    details = "; ".join(f"{key} [{COMPARED[key]}]: checkpoint {_describe(key, a, gbs)} vs run {_describe(key, b, gbs)}"
                        for key, (a, b) in differences.items())
    raise error(f"checkpoint {directory} was trained with another learning-rate/weight-decay schedule "
                          f"({details}); pass --override-opt_param-scheduler to use this run's schedule flags, or "
                          f"--use-checkpoint-opt_param-scheduler to keep the checkpoint's schedule")
