"""models/initialization.py decisions, without a process group: where the weights are born per backend and flag,
the config fields, and Megatron-LM's per-rank seed (``--seed + 100 * pipeline rank``, ``+ 10 * data-parallel
rank`` with ``--data-parallel-random-init``). Placement itself: tests/musa_sim/test_device_init.py."""

from __future__ import annotations

import argparse

import pytest

from mtmegatron.backends.registry import BUILTIN
from mtmegatron.models import initialization
from mtmegatron.models.section import Initialization

get_backend_description = BUILTIN.__getitem__


def _args(**kw):
    return argparse.Namespace(**{"use_cpu_initialization": None, "data_parallel_random_init": False, "seed": 1234,
                                 "load": None, "moe_use_upcycling": False, "init_model_with_meta_device": False,
                                 **kw})


@pytest.mark.parametrize("device_type,flag,host", [("musa", None, False), ("cuda", None, False),
                                                   ("musa", True, True), ("cpu", None, True), ("cpu", True, True)])
def test_where_the_weights_are_born(monkeypatch, device_type, flag, host):
    monkeypatch.setattr(initialization, "active_backend", lambda: get_backend_description(device_type))
    args = Initialization.of(_args(use_cpu_initialization=flag))
    assert initialization.host_initialization(args) is host
    assert initialization.config_fields(args) == {"use_cpu_initialization": host, "perform_initialization": True}
    line = initialization.describe(args)
    assert line.startswith("mtmegatron: init: on the host") is host, line
    assert (f"on the {device_type} device" in line) is (not host), line


@pytest.mark.parametrize("dp_random,pp_rank,dp_rank,seed", [(False, 0, 3, 1234), (False, 2, 3, 1434),
                                                             (True, 1, 3, 1364)])
def test_rank_seed_is_megatron_lms(monkeypatch, dp_random, pp_rank, dp_rank, seed):
    from megatron.core import parallel_state

    monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_rank", lambda: pp_rank)
    monkeypatch.setattr(parallel_state, "get_data_parallel_rank", lambda: dp_rank)
    assert initialization.rank_seed(_args(data_parallel_random_init=dp_random)) == seed


def test_flags_parse_with_megatron_lms_defaults():
    from mtmegatron.config.arguments import parse_args

    args = parse_args(["--backend", "cpu", "--mock-data"], world_size=1)
    assert args.use_cpu_initialization is None and args.data_parallel_random_init is False
    args = parse_args(["--backend", "cpu", "--mock-data", "--use-cpu-initialization", "--data-parallel-random-init"],
                      world_size=1)
    assert args.use_cpu_initialization is True and args.data_parallel_random_init is True
