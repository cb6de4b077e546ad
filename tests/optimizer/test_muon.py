"""``--optimizer muon`` / ``dist_muon`` (training/optimizer.py, training_flags.check_muon): built by megatron-core's
``get_megatron_muon_optimizer``, as Megatron-LM 0.16.1 does.

megatron-core 0.16.1's Muon needs emerging-optimizers v0.1.0, which this CI image cannot import (every release
imports triton; PyPI's 0.3 needs Python >= 3.12 and renamed the API). The training runs use a stand-in with the
v0.1.0 signatures and update rule (tests/optimizer/muon_stand_in; it matched the real v0.1.0 source, run by hand
on this box with its GPU-only triton module left out, to 2e-5 in the loss after 4 steps): megatron-core's own Muon
code, the chaining with Adam, the layer-wise distributed optimizer and mtmegatron's wiring run for real.
Two runs of 4 iterations shared by the asserts (module fixtures): muon on one rank, dist_muon on two (DP2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.config import training_flags
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

STAND_IN = Path(__file__).with_name("muon_stand_in")
MUON_FLAGS = ["--train-iters", "4", "--log-interval", "1", "--muon-momentum", "0.5", "--muon-use-nesterov",
              "--muon-num-ns-steps", "4", "--muon-tp-mode", "distributed"]


def _run(tmp_path_factory, optimizer: str, nproc: int):
    log_dir = tmp_path_factory.mktemp(optimizer)
    record = log_dir / "stand_in.jsonl"
    proc, rows = run_pretrain(nproc, TINY + MUON_FLAGS + ["--optimizer", optimizer], log_dir, timeout=300,
                              env={"PYTHONPATH": str(STAND_IN), "MUON_STAND_IN_RECORD": str(record)})
    return proc.stdout + proc.stderr, [r["loss"] for r in rows], [json.loads(x) for x in record.read_text().splitlines()]


@pytest.fixture(scope="module")
def muon(tmp_path_factory):
    return _run(tmp_path_factory, "muon", 1)


@pytest.fixture(scope="module")
def dist_muon(tmp_path_factory):
    return _run(tmp_path_factory, "dist_muon", 2)


def test_muon_trains_with_megatron_cores_muon_and_the_flags_reach_it(muon):
    output, losses, records = muon
    assert "megatron.TensorParallelMuon" in output, output[-2000:]  # Muon on 2-D weights, Adam on the rest
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.3, losses
    built = next(r for r in records if "momentum_beta" in r)
    assert built["momentum_beta"] == 0.5 and built["use_nesterov"] is True, records
    called = next(r for r in records if "num_ns_steps" in r)
    assert called["num_ns_steps"] == 4 and called["tp_mode"] == "distributed", records


def test_dist_muon_equals_muon(muon, dist_muon):
    """Layer-wise sharding over DP2 changes who updates a weight, not the update: the same global batch gives
    one rank's losses (measured: equal to 5 decimals; gloo needs the padded gather of
    patches/layer_wise_optimizer_gloo_allgather.py, without which the first step fails)."""
    _, losses, _ = muon
    output, sharded, _ = dist_muon
    assert "megatron.TensorParallelMuon" in output, output[-2000:]
    assert sharded == pytest.approx(losses, rel=1e-5), (sharded, losses)


def _hide_emerging_optimizers(monkeypatch):
    for name in list(sys.modules):
        if name.startswith("emerging_optimizers"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "emerging_optimizers", None)  # import raises ImportError


def test_without_the_package_one_line_at_parse_time(monkeypatch):
    _hide_emerging_optimizers(monkeypatch)
    with pytest.raises(ConfigError) as err:
        parse_args(TINY + ["--train-iters", "1", "--optimizer", "dist_muon"], world_size=1)
    message = str(err.value)
    assert "--optimizer dist_muon needs the emerging-optimizers package" in message
    assert "mtmegatron[muon]" in message and "\n" not in message


@pytest.fixture
def stand_in_importable(monkeypatch):
    """The stand-in on sys.path for one test; its modules leave sys.modules afterwards (else a later test in this
    worker would find emerging_optimizers importable: tests/flags/test_flag_effects.py's muon rows did)."""
    monkeypatch.syspath_prepend(str(STAND_IN))
    for name in list(sys.modules):
        if name.startswith("emerging_optimizers"):
            monkeypatch.delitem(sys.modules, name)
    yield
    for name in [n for n in sys.modules if n.startswith("emerging_optimizers")]:
        del sys.modules[name]


def test_the_renamed_api_of_newer_releases_is_refused(stand_in_importable, monkeypatch):
    import emerging_optimizers.orthogonalized_optimizers as module

    def __init__(self, params, lr, momentum_beta, weight_decay, *, nesterov, **kwargs):  # 0.2+'s signature
        pass

    monkeypatch.setattr(module.OrthogonalizedOptimizer, "__init__", __init__)
    with pytest.raises(ConfigError, match="calls the emerging-optimizers 0.1 API.*use_nesterov -> nesterov"):
        parse_args(TINY + ["--train-iters", "1", "--optimizer", "muon"], world_size=1)


@pytest.mark.parametrize("flag", ["--use-distributed-optimizer", "--overlap-grad-reduce", "--fp16"])
def test_megatron_lms_muon_refusals_are_one_line(flag):
    args = parse_args(TINY + ["--train-iters", "1"], world_size=1)
    args.optimizer = "muon"
    setattr(args, dict((f, d) for d, f in training_flags.MUON_REFUSED)[flag], True)
    with pytest.raises(ConfigError, match=f"--optimizer muon does not support {flag}"):
        training_flags.check_muon(args)
