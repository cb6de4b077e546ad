"""torch_dist checkpoints under torch FSDP2 on the cpu backend (gloo): resume exactness, and checkpoints that move
between FSDP2 and DDP; what cannot move (or be written) is one line.

DP2, tiny llama3 (SwiGLU), fp32, 8 iterations, a checkpoint at iteration 4 (model, optimizer, schedule, RNG, data
position). A run resumed from it continues the uninterrupted run: FSDP2 from FSDP2 exactly (measured 0), DDP
from FSDP2, FSDP2 from DDP (plain optimizer: the same global ShardedTensors) and FSDP2 from DDP + the distributed
optimizer (its fully reshardable state: the same per-parameter moments, its step and param groups converted) within
ATOL (measured <= 1.2e-7). A distributed-optimizer run takes an FSDP2 checkpoint's weights (``--no-load-optim``; its
first loss equals the FSDP2 run's at that iteration) and refuses its optimizer state in one line (exit 2): its
request holds fp32 main parameters that a plain optimizer never wrote. Megatron-FSDP checkpoints are refused at parse
time: megatron-core 0.16.1 writes them only as fsdp_dtensor. Nine torchrun jobs, ~120 s on 2 cores.
"""

from __future__ import annotations

import shutil

import pytest

from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.training.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

ITERS, SAVED_AT = 8, 4
ATOL = 1e-6
ENGINES = {"fsdp2": ["--use-torch-fsdp2"], "ddp": [], "distopt": ["--use-distributed-optimizer"]}


class Runs:
    """Each (name, command) run once per module; ``checkpoint(engine)`` is that engine's directory holding only
    iteration SAVED_AT (copied out of its full run, which also saved at ITERS)."""

    def __init__(self, root):
        self.root, self.losses = root, {}

    def full(self, engine: str) -> list[float]:
        if engine not in self.losses:
            args = ENGINES[engine] + ["--save", str(self.root / f"save_{engine}"), "--save-interval", str(SAVED_AT)]
            self.losses[engine] = self._losses(engine, args)
            assert len(self.losses[engine]) == ITERS
        return self.losses[engine]

    def checkpoint(self, engine: str):
        self.full(engine)
        target = self.root / f"at{SAVED_AT}_{engine}"
        if not target.exists():
            name = f"iter_{SAVED_AT:07d}"
            shutil.copytree(self.root / f"save_{engine}" / name, target / name)
            (target / "latest_checkpointed_iteration.txt").write_text(str(SAVED_AT))
        return target

    def resumed(self, engine: str, saved_by: str, *extra: str) -> list[float]:
        name = f"{engine}_from_{saved_by}{''.join(extra)}"
        if name not in self.losses:
            args = ENGINES[engine] + ["--load", str(self.checkpoint(saved_by)), *extra]
            self.losses[name] = self._losses(name, args)
        return self.losses[name]

    def _losses(self, name: str, args: list[str]) -> list[float]:
        _, rows = run_pretrain(2, TINY + ["--train-iters", str(ITERS)] + args, self.root / name)
        return [r["loss"] for r in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("fsdp_ckpt"))


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


def test_fsdp2_resumes_exactly(runs):
    full, resumed = runs.full("fsdp2"), runs.resumed("fsdp2", "fsdp2")
    assert full[-1] < full[0] - 0.1, f"did not learn: {full}"
    assert _max_diff(resumed, full[SAVED_AT:]) <= 1e-7, (resumed, full)


@pytest.mark.parametrize("engine, saved_by", [("ddp", "fsdp2"), ("fsdp2", "ddp"), ("fsdp2", "distopt")])
def test_checkpoint_moves_between_fsdp2_and_ddp(runs, engine, saved_by):
    """Model, optimizer (exp_avg, exp_avg_sq, step) and schedule: the resumed run continues the one that saved
    (a distributed optimizer's fully reshardable state keeps the moments per parameter, as the plain one)."""
    assert _max_diff(runs.full("ddp"), runs.full("fsdp2")) <= ATOL  # the two engines train alike
    resumed = runs.resumed(engine, saved_by)
    diff = _max_diff(resumed, runs.full(saved_by)[SAVED_AT:])
    assert diff <= ATOL, f"{engine} from {saved_by}'s checkpoint: max |loss - uninterrupted| = {diff:.3g}"


def test_distributed_optimizer_takes_fsdp2_weights(runs):
    """The first loss after the load depends on the weights only: it equals the FSDP2 run's at that iteration."""
    resumed = runs.resumed("distopt", "fsdp2", "--no-load-optim")
    assert abs(resumed[0] - runs.full("fsdp2")[SAVED_AT]) <= ATOL, (resumed, runs.full("fsdp2"))


def test_distributed_optimizer_refuses_fsdp2_optimizer_state(runs):
    proc, _ = run_pretrain(2, TINY + ["--train-iters", str(ITERS), "--use-distributed-optimizer", "--load",
                                      str(runs.checkpoint("fsdp2"))], runs.root / "distopt_refused", expect_ok=False)
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "holds plain-optimizer state; run without --use-distributed-optimizer" in lines[0], lines[0]


MFSDP = ["--use-megatron-fsdp", "--use-distributed-optimizer"]


@pytest.mark.parametrize("extra, says", [
    (MFSDP + ["--save", "ckpt"], "--use-megatron-fsdp with --save/--load: megatron-core 0.16.1's distributed "
                                 "optimizer saves Megatron-FSDP state only in --ckpt-format fsdp_dtensor"),
    (MFSDP + ["--data-parallel-sharding-strategy", "optim_grads", "--load", "ckpt"],
     "--use-megatron-fsdp with --save/--load: megatron-core 0.16.1's distributed optimizer saves"),
    (["--use-torch-fsdp2", "--tensor-model-parallel-size", "2", "--save", "ckpt"],
     "--use-torch-fsdp2 with --save/--load: with --tensor-model-parallel-size (or --expert-tensor-parallel-size) > 1"),
    (["--use-torch-fsdp2", "--num-experts", "4", "--expert-tensor-parallel-size", "2", "--load", "ckpt"],
     "--use-torch-fsdp2 with --save/--load: with --tensor-model-parallel-size (or --expert-tensor-parallel-size) > 1"),
])
def test_refused_checkpoint_is_one_line(extra, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        parse_args(TINY + ["--train-iters", "1"] + extra, world_size=4)
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)
