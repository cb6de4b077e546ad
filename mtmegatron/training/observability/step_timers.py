"""``--timing-log-level``, ``--timing-log-option``, ``--log-timers-to-tensorboard``: megatron-core's ``Timers``
(megatron/core/timers.py) with Megatron-LM's timer names.

Installing the timers on the model config and the optimizer config switches on the timers megatron-core
already has (forward-backward, forward/backward-compute, pipeline send/recv, all-grads-sync, the optimizer's
parts, params-all-gather); ``timed`` adds Megatron-LM's training-side ones (optimizer, batch-generator,
save-checkpoint). At each log interval ``report`` reads them over all ranks (a collective) and returns the
text Megatron-LM prints and, with --log-timers-to-tensorboard, ``{"<name>-time": seconds per iteration}`` for
the metrics row (max over ranks; Megatron-LM's tensorboard tags).
May assume: process groups and model/optimizer built; ``report`` is called on every rank at the same iterations.
"""

from __future__ import annotations

import contextlib

from megatron.core.timers import Timers
from megatron.core.utils import get_model_config

from mtmegatron.training.observability.section import Observability

# Megatron-LM's training_log lists (megatron/training/training.py)
LEVEL_1 = ("forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "all-grads-sync",
           "params-all-gather", "optimizer-copy-to-main-grad", "optimizer-unscale-and-check-inf",
           "optimizer-clip-main-grad", "optimizer-count-zeros", "optimizer-inner-step",
           "optimizer-copy-main-to-model-params", "optimizer")
LEVEL_2 = ("batch-generator", "forward-compute", "backward-compute", "forward-recv", "forward-send",
           "backward-recv", "backward-send", "forward-send-forward-recv", "forward-send-backward-recv",
           "backward-send-forward-recv", "backward-send-backward-recv",
           "forward-backward-send-forward-backward-recv")


def _optimizers(optimizer) -> list:
    return [optimizer, *getattr(optimizer, "chained_optimizers", [])]


class StepTimers:
    def __init__(self, observability: Observability, model, optimizer):
        self.timers = Timers(observability.timing_log_level, observability.timing_log_option)
        self.to_row = observability.log_timers_to_tensorboard
        self.names = [*(LEVEL_1 if observability.timing_log_level >= 1 else ()),
                      *(LEVEL_2 if observability.timing_log_level >= 2 else ())]
        self.configs = [get_model_config(chunk) for chunk in model]
        for config in self.configs:
            config.timers, config.barrier_with_L1_time = self.timers, observability.barrier_with_L1_time
        self.optimizer_configs = [opt.config for opt in _optimizers(optimizer)
                                  if getattr(opt, "config", None) is not None]
        for config in self.optimizer_configs:
            config.timers, config.barrier_with_L1_time = self.timers, observability.barrier_with_L1_time

    def report(self, iterations: int) -> tuple[dict, str | None]:
        """Timers since the last report, per iteration: the row values and the text rank 0 prints."""
        if not self.names:
            return {}, None
        row = {}
        if self.to_row:
            # what megatron-core's Timers.write puts in tensorboard (max over ranks), before the reset below
            times = self.timers._get_global_min_max_time(self.names, reset=False, barrier=False,
                                                         normalizer=iterations)
            row = {f"{name}-time": max_time for name, (_, max_time) in times.items()}
        return row, self.timers.get_all_timers_string(self.names, normalizer=iterations, reset=True)

    @contextlib.contextmanager
    def paused(self):
        """No model timers inside the block (Megatron-LM's evaluation runs the schedule without them)."""
        for config in self.configs:
            config.timers = None
        try:
            yield
        finally:
            for config in self.configs:
                config.timers = self.timers

    def close(self) -> None:
        """Take the timers off the configs (what runs after training is not timed)."""
        for config in self.configs + self.optimizer_configs:
            config.timers = None

    def print_now(self, name: str, rank: int) -> None:
        """Megatron-LM prints the save-checkpoint timer right after each save (a collective)."""
        text = self.timers.get_all_timers_string([name], reset=True)
        if rank == 0 and text:
            print(text, flush=True)


@contextlib.contextmanager
def timed(model_chunk, name: str, log_level: int, barrier: bool = False, stop_barrier: bool = False):
    """Time the block with the run's timer ``name`` (when timers are installed and the level is on);
    ``barrier``/``stop_barrier``: synchronise the ranks before starting/stopping, as Megatron-LM does."""
    timers = get_model_config(model_chunk).timers
    if timers is None:
        yield
        return
    timer = timers(name, log_level=log_level)
    timer.start(barrier=barrier)
    try:
        yield
    except BaseException:  # no barrier: the other ranks may be inside a collective this rank left (a failed save)
        timer.stop(barrier=False)
        raise
    timer.stop(barrier=stop_barrier)
