"""The observability flags: Megatron-LM 0.16.1's option strings, dests and defaults (from the shared flag table),
their rules as one-line errors, the missing-wandb error, and manual garbage collection's collection points.
"""

from __future__ import annotations

import ast
import csv
import gc
import pathlib
import sys
from types import SimpleNamespace

import pytest

from helpers.pretrain_runner import TINY
from mtmegatron.config.arguments import build_parser, parse_args
from mtmegatron.utils.errors import ConfigError
from mtmegatron.training.observability.run_hooks import ManualGC
from mtmegatron.backends.cpu import CPU
from mtmegatron.backends.cuda import CUDA
from mtmegatron.backends.musa import MUSA
from mtmegatron.training.observability.profiler import profiler_activities, profiler_kind

FLAGS = ("--log-throughput", "--log-params-norm", "--log-num-zeros-in-grad", "--timing-log-level",
         "--timing-log-option", "--no-barrier-with-level-1-timing", "--log-timers-to-tensorboard",
         "--log-memory-to-tensorboard", "--log-world-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
         "--tensorboard-log-interval", "--tensorboard-queue-size", "--wandb-project", "--wandb-exp-name",
         "--wandb-save-dir", "--wandb-entity", "--profile", "--profile-step-start", "--profile-step-end",
         "--profile-ranks", "--use-pytorch-profiler", "--manual-gc", "--manual-gc-interval", "--no-manual-gc-eval",
         "--disable-manual-gc-eval")
BASE = TINY + ["--train-iters", "4"]


def _flag_table() -> dict:
    for root in pathlib.Path(__file__).resolve().parents:
        path = root / "shared" / "megatron-lm-0.16.1-flags.tsv"
        if path.is_file():
            with open(path) as f:
                return {row["flag"]: row for row in csv.DictReader(f, delimiter="\t")}
    pytest.skip("shared/megatron-lm-0.16.1-flags.tsv is not beside this checkout")


def test_option_strings_dests_and_defaults_are_megatron_lms():
    table = _flag_table()
    actions = {opt: action for action in build_parser()._actions for opt in action.option_strings}
    for flag in FLAGS:
        row, action = table[flag], actions[flag]
        assert action.dest == row["dest"], flag
        expected = None if row["default"] == "None" else ast.literal_eval(row["default"])
        assert action.default == expected, flag
        if row["choices"]:
            assert [str(c) for c in action.choices] == row["choices"].split(","), flag


@pytest.mark.parametrize("extra, message", [
    (["--profile", "--profile-step-start", "5", "--profile-step-end", "5"],
     "--profile-step-end 5 must be after --profile-step-start 5"),
    (["--profile", "--profile-step-start", "-1"], "--profile-step-start must be >= 0"),
    (["--manual-gc", "--manual-gc-interval", "-2"], "--manual-gc-interval must be >= 0, not -2"),
    (["--tensorboard-log-interval", "0"], "--tensorboard-log-interval must be >= 1"),
])
def test_rules_are_one_line_errors(extra, message):
    with pytest.raises(ConfigError) as e:
        parse_args(BASE + extra, world_size=1)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_wandb_flag_without_wandb_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError, match=r"--wandb-project needs wandb.*pip install 'mtmegatron\[wandb\]'"):
        parse_args(BASE + ["--wandb-project", "p"], world_size=1)


def test_profiler_choice_and_activities():
    import torch

    plain = SimpleNamespace(use_pytorch_profiler=False)
    assert profiler_kind(plain, CUDA) == "nsys"  # Megatron-LM's --profile on CUDA
    assert profiler_kind(plain, CPU) == profiler_kind(plain, MUSA) == "torch"
    assert profiler_kind(SimpleNamespace(use_pytorch_profiler=True), CUDA) == "torch"
    assert profiler_activities(CPU) == [torch.profiler.ProfilerActivity.CPU]
    assert profiler_activities(CUDA)[1] == torch.profiler.ProfilerActivity.CUDA
    assert profiler_activities(MUSA)[1] == torch.profiler.ProfilerActivity.PrivateUse1


def test_manual_gc_collects_where_megatron_lm_does():
    full, young = [], []

    def count(phase, info):
        if phase == "start":
            (full if info["generation"] == 2 else young).append(info["generation"])

    was_enabled = gc.isenabled()
    gc.callbacks.append(count)
    try:
        manual = ManualGC(SimpleNamespace(manual_gc=True, manual_gc_interval=2, manual_gc_eval=True))
        assert not gc.isenabled() and len(full) == 1  # off, after one full collection
        for iteration in (1, 2, 3, 4):
            manual.after_step(iteration)
        assert len(full) == 3  # iterations 2 and 4
        young.clear()
        with manual.evaluation():
            assert len(full) == 4  # before validation
        assert young == [0]  # after it: the young generation
        manual.close()
        assert gc.isenabled()
        off = ManualGC(SimpleNamespace(manual_gc=False, manual_gc_interval=2, manual_gc_eval=True))
        off.after_step(2)
        assert len(full) == 4 and gc.isenabled()
    finally:
        gc.callbacks.remove(count)
        if was_enabled:
            gc.enable()
