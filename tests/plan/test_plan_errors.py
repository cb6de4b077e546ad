"""Bad input to ``mtmegatron plan`` is one line on stderr and exit status 2: a layout the world size does not
divide, an unknown device, a device size it cannot read, and a command line ``mtmegatron.pretrain`` refuses (the
same message as pretrain's, after the plan prefix). In-process: ``cli.main`` and ``pretrain.main`` with capsys."""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY

from mtmegatron import cli, pretrain

BASE = [a for a in TINY if a not in ("--backend", "cpu")] + ["--train-iters", "1"]


def _plan_error(capsys, argv) -> str:
    assert cli.main(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("mtmegatron plan: error: "), err
    return err[0].removeprefix("mtmegatron plan: error: ")


def _pretrain_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        pretrain.main(argv)
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    return line.removeprefix("mtmegatron.pretrain: error: ")


@pytest.mark.parametrize("refused", [
    ["--num-layers", "3", "--pipeline-model-parallel-size", "2"],  # stages do not divide the layers
    ["--lr", "-1", "--optimizer", "sgd", "--sgd-momentum", "-2"],
    ["--micro-batch-size", "3"],  # global batch 8 is not a multiple of 3 x DP
])
def test_pretrain_refusals_are_refused_alike(refused, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = [*BASE, "--log-dir", str(tmp_path), *refused]
    expected = _pretrain_error(capsys, ["--backend", "cpu", *argv])
    assert _plan_error(capsys, ["--world-size", "2", *argv]) == expected


def test_layout_that_does_not_divide(capsys, tmp_path):
    message = _plan_error(capsys, ["--world-size", "3", *BASE, "--log-dir", str(tmp_path),
                                   "--tensor-model-parallel-size", "2"])
    assert "3" in message and "2" in message, message


@pytest.mark.parametrize("flags, words", [
    (["--device", "v100"], "--device v100: unknown device (known: h100, h200, a100, s4000, s5000"),
    (["--device-memory", "eighty"], "--device-memory 'eighty': give a size"),
    (["--device", "h100", "--device-memory", "80GiB"], "give --device or --device-memory, not both"),
    (["--search", "--device-memory", "80GiB"], "--search ranks layouts by step time and needs --device"),
])
def test_planner_flag_mistakes(flags, words, capsys, tmp_path):
    assert words in _plan_error(capsys, ["--world-size", "1", *flags, *BASE, "--log-dir", str(tmp_path)])


def test_device_memory_sizes():
    from mtmegatron.config.plan_flags import memory_bytes

    assert memory_bytes("80GiB") == 80 * 2**30 and memory_bytes("96GB") == 96 * 10**9
    assert memory_bytes("81920MiB") == 80 * 2**30 and memory_bytes("1024") == 1024
