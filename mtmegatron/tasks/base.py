"""The interface of a kind of run (``Task``): what ``mtmegatron.pretrain`` asks of it, in the order it asks.

1. ``prepare(args, progress)``: before any process group, with ``args`` still writable: read and check the data
   (every user mistake one ``ConfigError``); returns what the run reads (``data`` below).
2. ``datasets(args, rank, plan, num_samples, data)``: the train dataset and the validation set(s) or None, for a
   run planned by ``plan`` (data/position.py's SamplePlan) over ``num_samples`` training samples; prints the data
   line(s) of the start-up.
3. ``step(args, data)``: the ``training.train_step.Step`` the loop runs: forward step and loss, the schedule's
   shape, the micro-batch reader of these datasets, the extra metrics of an iteration.
4. ``start(model, args, data)``: what it prints or measures once the model exists, before the first step.
5. ``finish(model, args, data, terminated)``: after a run that ended well: the loss plot, samples, evaluations
   (``terminated``: stopped by a signal or the time limit, so no slow outputs).
May assume: called on every rank by pretrain.py; the training loop below never sees a Task, only its Step.
"""

from __future__ import annotations

import argparse


class Task:
    """One kind of run; ``name`` is what a family names (``Family.task``)."""

    name = ""

    def prepare(self, args: argparse.Namespace, progress: bool):
        raise NotImplementedError

    def datasets(self, args: argparse.Namespace, rank: int, plan, num_samples: int, data) -> tuple:
        raise NotImplementedError

    def step(self, args: argparse.Namespace, data):
        raise NotImplementedError

    def start(self, model, args: argparse.Namespace, data) -> None:
        """Nothing by default."""

    def finish(self, model, args: argparse.Namespace, data, terminated: bool) -> None:
        raise NotImplementedError
