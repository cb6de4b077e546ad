"""The interface of a kind of run (``Task``): what ``mtmegatron.pretrain`` asks of it, in the order it asks.

1. ``prepare(args, progress)`` (a static method, before any process group): read and check the data (every user
   mistake one ``ConfigError``) and complete the run's flags from it, with ``args`` still writable (parse-time
   resolution: data/resolve.py, sft/prepare.py, tasks/qwen_vl/data.py write the data path, tokenizer, vocabulary
   and token ids into it); returns what the run reads (``data`` below).
2. ``of(values, embedded_corpus)``: the Task, built once from the completed values (a RunArgs): each task keeps
   the typed sections it reads (utils/section.py) and ``embedded_corpus`` (config/ derives it; not a flag). The
   methods below take no flags.
3. ``datasets(rank, plan, num_samples, data)``: the train dataset and the validation set(s) or None, for a run
   planned by ``plan`` (data/position.py's SamplePlan) over ``num_samples`` training samples; prints the data
   line(s) of the start-up.
4. ``step(data)``: the ``training.train_step.Step`` the loop runs: forward step and loss, the schedule's shape, the
   micro-batch reader of these datasets (it holds what it reads), the extra metrics of an iteration.
5. ``start(model, data)``: what it prints or measures once the model exists, before the first step.
6. ``finish(model, data, terminated)``: after a run that ended well: the loss plot, samples, evaluations
   (``terminated``: stopped by a signal or the time limit, so no slow outputs).
May assume: called on every rank by pretrain.py; ``step`` after the process groups exist (a reader's data-parallel
size is megatron-core's, equal to config/'s); the training loop below never sees a Task, only its Step.
"""

from __future__ import annotations

import argparse


class Task:
    """One kind of run; ``name`` is what a family names (``Family.task``)."""

    name = ""

    @staticmethod
    def prepare(args: argparse.Namespace, progress: bool):
        raise NotImplementedError

    @classmethod
    def of(cls, values, embedded_corpus: bool) -> "Task":
        raise NotImplementedError

    def datasets(self, rank: int, plan, num_samples: int, data) -> tuple:
        raise NotImplementedError

    def step(self, data):
        raise NotImplementedError

    def start(self, model, data) -> None:
        """Nothing by default."""

    def finish(self, model, data, terminated: bool) -> None:
        raise NotImplementedError


def data_parallel_size() -> int:
    """The readers' data-parallel size: megatron-core's parallel state (process groups started)."""
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_world_size()
