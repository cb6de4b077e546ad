"""Typed configuration sections (utils/section.py): every ``Section`` under mtmegatron/ names only dests the
pretrain parser defines and has no defaults; ``Resilience.of`` holds the values the flags gave, unchanged;
``RunConfig.of`` builds the same section; a missing value is one error naming the section and the field; equal
sections are equal and hashable (the rerun machine is kept for an equal one)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from pathlib import Path

import pytest

from mtmegatron import config
from mtmegatron.config import arguments
from mtmegatron.training.resilience import rerun
from mtmegatron.training.resilience.section import Resilience
from mtmegatron.utils.section import Section

PACKAGE = Path(arguments.__file__).resolve().parents[1]
FLAGS = ["--rerun-mode", "disabled", "--check-for-spiky-loss", "--no-check-for-nan-in-loss-and-grad",
         "--exit-signal-handler", "--exit-signal", "SIGUSR1", "--exit-duration-in-mins", "7",
         "--check-weight-hash-across-dp-replicas-interval", "3", "--distributed-timeout-seconds-after-init", "90",
         "--error-injection-rate", "5", "--error-injection-type", "correct_result"]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sections")  # the rerun machine creates its tracker file
    return config.parse(["--log-dir", str(tmp), "--result-rejected-tracker-filename", str(tmp / "rejected.txt")]
                        + FLAGS)


def test_every_section_names_only_parser_dests_and_has_no_defaults():
    for path in PACKAGE.rglob("section.py"):
        module = ".".join(("mtmegatron",) + path.relative_to(PACKAGE).with_suffix("").parts)
        importlib.import_module(module)
    sections = list(_subclasses(Section))
    assert Resilience in sections
    dests = {action.dest for action in arguments.build_parser()._actions}
    for section in sections:
        fields = dataclasses.fields(section)
        assert fields, section
        assert section.__dataclass_params__.frozen, section
        unknown = [f.name for f in fields if f.name not in dests]
        assert not unknown, f"{section.__qualname__}: not flag dests: {unknown}"
        defaulted = [f.name for f in fields if f.default is not dataclasses.MISSING
                     or f.default_factory is not dataclasses.MISSING]
        assert not defaulted, f"{section.__qualname__}: fields with defaults: {defaulted}"


def test_resilience_holds_the_flag_values(cfg):
    section = cfg.of(Resilience)
    assert section == Resilience(
        rerun_mode="disabled", error_injection_rate=5, error_injection_type="correct_result",
        result_rejected_tracker_filename=cfg.args.result_rejected_tracker_filename, check_for_nan_in_loss_and_grad=False,
        check_for_spiky_loss=True, exit_signal_handler=True, exit_signal="SIGUSR1", exit_duration_in_mins=7,
        check_weight_hash_across_dp_replicas_interval=3, distributed_timeout_seconds_after_init=90)
    assert section.result_rejected_tracker_filename.endswith("rejected.txt")
    assert all(getattr(section, f.name) is getattr(cfg.args, f.name) for f in dataclasses.fields(Resilience))
    with pytest.raises(dataclasses.FrozenInstanceError):
        section.rerun_mode = "validate_results"


def test_a_missing_value_is_one_error_naming_the_section_and_field(cfg):
    values = argparse.Namespace(**{f.name: getattr(cfg.args, f.name) for f in dataclasses.fields(Resilience)})
    del values.exit_signal
    with pytest.raises(AttributeError, match=r"Resilience\.of: the values have no 'exit_signal'"):
        Resilience.of(values)


def test_equal_sections_are_equal_hashable_and_keep_the_rerun_machine(cfg):
    one = Resilience.of(cfg.args)
    copied = argparse.Namespace(**vars(cfg.args))
    other = Resilience.of(copied)  # another object with the same values
    assert one == other and one is not other and hash(one) == hash(other) and len({one, other}) == 1
    copied.exit_duration_in_mins = 8
    assert Resilience.of(copied) != one
    first = rerun.machine(one)
    try:
        assert rerun.machine(other) is first  # an equal section never rebuilds the machine
        assert rerun.machine(Resilience.of(copied)) is not first
    finally:
        rerun.destroy_rerun_state_machine()
        rerun._section = None


def test_the_task_step_says_whether_its_loss_is_validated(cfg):
    """The start-up line takes it from the run's Step (the loop never asks the family): LLaVA's loss, as
    Megatron-LM's pretrain_vlm, skips the rerun machine's checks."""
    from mtmegatron.tasks.llava.step import llava_step
    from mtmegatron.training.train_step import lm_step

    resilience = cfg.of(Resilience)
    assert lm_step(cfg.args).loss_validated and not llava_step().loss_validated
    assert "(LLaVA: gradients only, as Megatron-LM's pretrain_vlm)" in rerun.describe(resilience, False)
    assert "LLaVA" not in rerun.describe(resilience, True)
