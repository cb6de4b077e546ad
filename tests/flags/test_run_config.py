"""``mtmegatron.config.parse(argv) -> RunConfig``: one frozen value, sections by flag group, where each value came
from, the kind of run decided once, and ``resolved`` making a new value instead of changing one."""

import copy
import dataclasses

import pytest

from mtmegatron import config


def test_parse_returns_a_frozen_run_config_with_sections_and_sources(tmp_path):
    cfg = config.parse(["--log-dir", str(tmp_path)])
    assert dataclasses.is_dataclass(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.task = "sft"
    with pytest.raises(AttributeError, match="read-only"):
        cfg.args.lr = 1.0
    assert (cfg.family, cfg.task, cfg.preset, cfg.world_size) == ("llama3", "text", ("llama3", "tiny"), 1)
    assert cfg.sources["num_layers"] == "preset llama3/tiny"
    assert cfg.section("model")["num_layers"] == cfg.args.num_layers
    with pytest.raises(TypeError):
        cfg.section("model")["num_layers"] = 3  # a read-only view
    with pytest.raises(KeyError, match="known:"):
        cfg.section("no such group")


def test_resolved_makes_a_new_frozen_value(tmp_path):
    cfg = config.parse(["--log-dir", str(tmp_path), "--lr", "0.002"])
    assert cfg.sources["lr"] == "flag --lr"
    learned = copy.copy(cfg.args)  # a later stage's own copy, with what it learned
    learned.vocab_size = 1234
    later = cfg.resolved(learned)
    assert later.args.vocab_size == 1234 and cfg.args.vocab_size != 1234
    with pytest.raises(AttributeError, match="read-only"):
        later.args.vocab_size = 1


def test_the_task_is_decided_once_from_the_family_and_sft(tmp_path):
    assert config.parse(["--log-dir", str(tmp_path), "--sft"]).task == "sft"
    assert config.parse(["--log-dir", str(tmp_path), "--model", "llava"]).task == "llava"
    assert config.parse(["--log-dir", str(tmp_path), "--model", "qwen2-vl"]).task == "text"  # mock data: its LM alone
