"""``--wandb-project``, ``--wandb-exp-name``, ``--wandb-save-dir``, ``--wandb-entity``: the metrics rows to Weights
& Biases, as Megatron-LM does it (one run, opened on the last rank, with the flags as its config).

wandb is an optional extra (``pip install 'mtmegatron[wandb]'``); arguments.py refuses the flag when it is not
installed. ``WANDB_MODE=offline`` (wandb's own switch) writes the run under ``<save-dir>/wandb/`` with no
network; ``wandb sync`` uploads it later. The save directory defaults to ``<save>/wandb`` as in Megatron-LM, and
to ``<log-dir>/wandb`` when the run has no --save.
May assume: the row is the one written to metrics.jsonl, complete on every rank (the loss is all-reduced).
"""

from __future__ import annotations

import os

from mtmegatron.training.observability.section import Observability


class WandbSink:
    def __init__(self, observability: Observability, rank: int, world_size: int, run_config: dict,
                 skip: set = frozenset()):
        """``run_config``: the run's flags, wandb's config of the run (as Megatron-LM gives it)."""
        self.run = None
        self.skip = skip  # row keys the flags keep out of tensorboard and wandb
        if not observability.wandb_project or rank != world_size - 1:
            return
        import wandb

        save_dir = observability.wandb_save_dir or os.path.join(observability.save or observability.log_dir, "wandb")
        os.makedirs(save_dir, exist_ok=True)
        kwargs = {"dir": save_dir, "name": observability.wandb_exp_name, "project": observability.wandb_project,
                  "config": {k: v for k, v in run_config.items() if not k.startswith("_")}}
        if observability.wandb_entity:
            kwargs["entity"] = observability.wandb_entity
        self.run = wandb.init(**kwargs)
        print(f"mtmegatron: rank {rank}: wandb run {self.run.name!r} of project {observability.wandb_project} "
              f"({self.run.settings.mode}) in {save_dir}", flush=True)

    def log(self, row: dict) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if k != "iteration" and k not in self.skip and v is not None},
                         step=row["iteration"])

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
