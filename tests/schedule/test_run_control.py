"""Run control with Megatron-LM's meaning (config/run_control.py, training/resilience/robustness.py, training/setup.py):

* ``--distributed-timeout-minutes`` reaches both the default process group and megatron-core's model-parallel
  groups (default 10, as Megatron-LM);
* ``--exit-signal-handler`` installs the handler for ``--exit-signal`` (default SIGTERM) and only then: without
  the flag the signal keeps its action, as in Megatron-LM (SIGTERM to one rank with the flag is
  tests/robustness/test_faults.py);
* ``--exit-duration-in-mins``: one rank over the limit is enough, all ranks stop after the same iteration,
  save it and exit 0 (a torchrun run; the test hook moves rank 1's program start 2 minutes back).
"""

from __future__ import annotations

import datetime
import signal

import pytest

from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.training import setup
from mtmegatron.training.resilience import robustness
from mtmegatron.training.resilience.section import Resilience
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError
from mtmegatron.utils.checkpoint_dirs import latest_complete_iteration

ARGS = TINY + ["--train-iters", "4"]


def test_distributed_timeout_reaches_every_process_group(monkeypatch):
    seen = {}
    monkeypatch.setenv("RANK", "0")  # as under torchrun: no single-process defaults written to the environment
    monkeypatch.setattr(setup.torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(setup.torch.distributed, "init_process_group", lambda **kw: seen.update(default=kw))
    monkeypatch.setattr(setup.parallel_state, "initialize_model_parallel", lambda **kw: seen.update(mp=kw))
    monkeypatch.setattr(setup, "seed_everything", lambda seed: None)
    monkeypatch.setattr(setup.initialization, "rank_seed", lambda args: args.seed)  # needs the (mocked) groups

    class Backend:
        dist_backend = "gloo"

        def set_device(self, local_rank):
            pass

    setup.init_distributed(parse_args(ARGS + ["--distributed-timeout-minutes", "45"], world_size=1), Backend())
    assert seen["default"]["timeout"] == datetime.timedelta(minutes=45)
    assert seen["mp"]["distributed_timeout_minutes"] == 45
    setup.init_distributed(parse_args(ARGS, world_size=1), Backend())
    assert seen["default"]["timeout"] == datetime.timedelta(minutes=10)  # Megatron-LM's default
    assert seen["mp"]["distributed_timeout_minutes"] == 10


def test_exit_signal_handler_only_with_the_flag():
    before_term, before_usr1 = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    plain = robustness.TerminationRequest(Resilience.of(parse_args(ARGS, world_size=1)))
    assert signal.getsignal(signal.SIGTERM) is before_term  # no handler: SIGTERM ends the process
    assert plain.requested() is None  # and nothing to agree on (no collective without the flags)
    plain.restore()

    args = parse_args(ARGS + ["--exit-signal-handler", "--exit-signal", "SIGUSR1"], world_size=1)
    assert args.exit_signal == "SIGUSR1"  # enum flags hold the member's name (config/megatron_flags.py)
    request = robustness.TerminationRequest(Resilience.of(args))
    try:
        assert signal.getsignal(signal.SIGUSR1) == request._handle
        assert signal.getsignal(signal.SIGTERM) is before_term
    finally:
        request.restore()
    assert signal.getsignal(signal.SIGUSR1) is before_usr1
    assert parse_args(ARGS + ["--exit-signal-handler"], world_size=1).exit_signal == "SIGTERM"
    assert parse_args(ARGS + ["--exit-signal", "10"], world_size=1).exit_signal == signal.Signals(10).name


@pytest.mark.parametrize("flags, message", [
    (["--distributed-timeout-minutes", "0"], "--distributed-timeout-minutes must be >= 1"),
    (["--exit-duration-in-mins", "-1"], "--exit-duration-in-mins must be >= 0"),
    (["--exit-signal-handler", "--exit-signal", "SIGKILL"], "SIGKILL cannot be caught"),
])
def test_run_control_mistakes_are_one_clear_error(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(ARGS + flags, world_size=1)


def test_exit_signal_must_be_a_signal_name():
    with pytest.raises(ConfigError, match="--exit-signal: 'SIGNOPE' is not a signal name"):
        parse_args(ARGS + ["--exit-signal", "SIGNOPE"], world_size=1)


def test_exit_duration_on_one_rank_stops_all_and_saves(tmp_path):
    ckpt = tmp_path / "ckpt"
    args = TINY + ["--use-distributed-optimizer", "--train-iters", "50", "--save", str(ckpt),
                   "--exit-duration-in-mins", "1"]
    proc, metrics = run_pretrain(2, args, tmp_path / "log", env={robustness.STARTED_ENV: "2:1"})
    assert "--exit-duration-in-mins 1 reached: stopping after iteration 1" in proc.stdout
    assert [r["iteration"] for r in metrics] == [1]
    assert latest_complete_iteration(str(ckpt)) == 1
