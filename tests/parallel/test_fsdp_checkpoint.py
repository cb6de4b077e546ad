"""torch_dist checkpoints under torch FSDP2 on the cpu backend (gloo): resume exactness, and checkpoints that move
between FSDP2 and DDP across layouts; what cannot move (or be written) is one line.

Tiny llama3 (SwiGLU), fp32, 8 iterations, a checkpoint at iteration 4 (model, optimizer, schedule, RNG, data
position) by each engine at DP2. A run resumed from it continues the run that saved: FSDP2 from FSDP2 exactly
(measured 0), DDP from FSDP2, FSDP2 from DDP (plain optimizer: the same global ShardedTensors) and FSDP2 from DDP +
the distributed optimizer (its fully reshardable state: the same per-parameter moments, its step and param groups
converted) within ATOL (measured <= 1.2e-7). Across layouts (the losses of one global batch under another TP/DP
split differ by float rounding only, so the run that saved, continued, is the reference): DDP + the distributed
optimizer takes FSDP2's DP2 checkpoint at DP1 and at TP2 (DP1) (training/checkpoint/plain_to_distributed_optimizer.py; measured
<= 1.2e-7; with --no-load-optim the second loss is 0.08 off), and FSDP2 at DP2 takes that TP2 run's own checkpoint
of iteration 6 (measured 1.2e-7). ``mcore-to-hf`` reads FSDP2's checkpoint (each tensor stored in per-rank row
blocks): its HF weights equal megatron-core's own load of that checkpoint into a one-rank model exactly, and those
exported from DDP's checkpoint of iteration 4 within 1e-5 (the two runs' weights differ by rounding: measured
6.7e-7). Megatron-FSDP (optim_grads, DP2; training/checkpoint/megatron_fsdp_checkpoint.py: each rank's rows of the same global
tensors, Adam's state in the distributed optimizer's fully reshardable format) resumes its own checkpoint exactly
(measured 0), DDP + the distributed optimizer resumes it at DP2 and at TP2 (measured 1.2e-7 each), and Megatron-FSDP
at DP2 resumes that TP2 run's checkpoint of iteration 6 (measured 0); ``mcore-to-hf`` reads it (equal to megatron-core's
own load exactly; 6.7e-7 from DDP's, 2.6e-7 from FSDP2's). Checked by hand, not here (the code path does not depend
on the strategy): no_shard, optim and optim_grads_params resume their own checkpoints exactly, a bf16 optim_grads run resumes its own
and DDP + the distributed optimizer in bf16 resumes it exactly, FSDP2 resumes Megatron-FSDP's checkpoint and back, a
GPT without SwiGLU saved at TP2 x DP2 resumes exactly under Megatron-FSDP there and under DDP + the distributed
optimizer at TP1 x DP2.
Fifteen pretrain jobs, three conversions and two reference loads: ~200 s on 2 free cores (estimate; the five
Megatron-FSDP jobs measured 97 s, the converter test 103 s; the first ten measured 455 s with the box loaded, load
average 15-19).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from helpers.cli_subprocess import ENV, run_cli
from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

ITERS, SAVED_AT, RESAVED_AT = 8, 4, 6
ATOL = 1e-6
ENGINES = {"fsdp2": ["--use-torch-fsdp2"], "ddp": [], "distopt": ["--use-distributed-optimizer"],
           "megatron_fsdp": ["--use-megatron-fsdp", "--use-distributed-optimizer", "--data-parallel-sharding-strategy",
                             "optim_grads"]}
LAYOUTS = {"dp2": (2, []), "dp1": (1, []), "tp2": (2, ["--tensor-model-parallel-size", "2"])}


class Runs:
    """Each (name, command) run once per module. ``checkpoint(run, at)`` is a directory holding only iteration
    ``at`` of that run's saves (a full run saves at SAVED_AT and ITERS; a resumed run asked to save, at
    RESAVED_AT and ITERS)."""

    def __init__(self, root):
        self.root, self.losses = root, {}

    def full(self, engine: str) -> list[float]:
        if engine not in self.losses:
            args = ENGINES[engine] + ["--save", str(self.root / f"save_{engine}"), "--save-interval", str(SAVED_AT)]
            self.losses[engine] = self._losses(engine, 2, args)
            assert len(self.losses[engine]) == ITERS
        return self.losses[engine]

    def checkpoint(self, run: str, at: int = SAVED_AT):
        if run in ENGINES:
            self.full(run)
        assert run in self.losses, f"{run} has not run"
        target = self.root / f"at{at}_{run}"
        if not target.exists():
            name = f"iter_{at:07d}"
            shutil.copytree(self.root / f"save_{run}" / name, target / name)
            (target / "latest_checkpointed_iteration.txt").write_text(str(at))
        return target

    def resumed(self, engine: str, saved_by: str, *extra: str, layout: str = "dp2", saves: bool = False,
                at: int = SAVED_AT) -> list[float]:
        name = f"{engine}_{layout}_from_{saved_by}{''.join(extra)}"
        if name not in self.losses:
            nproc, layout_flags = LAYOUTS[layout]
            args = ENGINES[engine] + layout_flags + ["--load", str(self.checkpoint(saved_by, at)), *extra]
            if saves:
                args += ["--save", str(self.root / f"save_{name}"), "--save-interval", str(RESAVED_AT - at)]
            self.losses[name] = self._losses(name, nproc, args)
        return self.losses[name]

    def _losses(self, name: str, nproc: int, args: list[str]) -> list[float]:
        _, rows = run_pretrain(nproc, TINY + ["--train-iters", str(ITERS)] + args, self.root / name)
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


def _distopt_tp2_from_fsdp2(runs) -> list[float]:
    return runs.resumed("distopt", "fsdp2", layout="tp2", saves=True)


@pytest.mark.parametrize("layout", ["dp1", "tp2"])
def test_distributed_optimizer_resumes_fsdp2_checkpoint_at_another_layout(runs, layout):
    """FSDP2's DP2 checkpoint (plain optimizer state) into DDP + the distributed optimizer at DP1 / TP2: weights,
    moments, step and schedule; the losses continue FSDP2's run (the first depends on the weights only, the next
    ones on the moments and the step as well)."""
    resumed = _distopt_tp2_from_fsdp2(runs) if layout == "tp2" else runs.resumed("distopt", "fsdp2", layout=layout)
    diff = _max_diff(resumed, runs.full("fsdp2")[SAVED_AT:])
    assert diff <= ATOL, f"distributed optimizer at {layout} from FSDP2's checkpoint: max |loss diff| = {diff:.3g}"


def test_fsdp2_resumes_distributed_optimizer_checkpoint_of_another_layout(runs):
    """The way back: the TP2 distributed-optimizer run's checkpoint of iteration RESAVED_AT into FSDP2 at DP2."""
    source = _distopt_tp2_from_fsdp2(runs)
    resumed = runs.resumed("fsdp2", "distopt_tp2_from_fsdp2", at=RESAVED_AT)
    diff = _max_diff(resumed, source[RESAVED_AT - SAVED_AT:])
    assert diff <= ATOL, f"FSDP2 at DP2 from the TP2 distributed optimizer's checkpoint: max |loss diff| = {diff:.3g}"


def test_megatron_fsdp_resumes_exactly(runs):
    full, resumed = runs.full("megatron_fsdp"), runs.resumed("megatron_fsdp", "megatron_fsdp")
    assert full[-1] < full[0] - 0.1, f"did not learn: {full}"
    assert _max_diff(resumed, full[SAVED_AT:]) <= 1e-7, (resumed, full)


def _distopt_tp2_from_megatron_fsdp(runs) -> list[float]:
    return runs.resumed("distopt", "megatron_fsdp", layout="tp2", saves=True)


@pytest.mark.parametrize("layout", ["dp2", "tp2"])
def test_distributed_optimizer_resumes_megatron_fsdp_checkpoint(runs, layout):
    """Megatron-FSDP's DP2 checkpoint (each rank's rows of the same global tensors; Adam's state in the fully
    reshardable format) into DDP + the distributed optimizer at DP2 and at TP2 (DP1): the run continues."""
    resumed = (_distopt_tp2_from_megatron_fsdp(runs) if layout == "tp2"
               else runs.resumed("distopt", "megatron_fsdp", layout=layout))
    diff = _max_diff(resumed, runs.full("megatron_fsdp")[SAVED_AT:])
    assert diff <= ATOL, f"distributed optimizer at {layout} from Megatron-FSDP's checkpoint: max |loss diff| = {diff:.3g}"


def test_megatron_fsdp_resumes_distributed_optimizer_checkpoint_of_another_layout(runs):
    """The way back: the TP2 distributed-optimizer run's checkpoint of iteration RESAVED_AT into Megatron-FSDP at
    DP2 (each rank asks for its rows; DCP fills them in place)."""
    source = _distopt_tp2_from_megatron_fsdp(runs)
    resumed = runs.resumed("megatron_fsdp", "distopt_tp2_from_megatron_fsdp", at=RESAVED_AT)
    diff = _max_diff(resumed, source[RESAVED_AT - SAVED_AT:])
    assert diff <= ATOL, f"Megatron-FSDP from the TP2 distributed optimizer's checkpoint: max |loss diff| = {diff:.3g}"


# megatron-core's own resharding load of the checkpoint into a one-rank model, through the converter's mapping:
# what mcore-to-hf must write (it streams the stored tensors instead)
_REFERENCE_EXPORT = """
import sys, torch
from mtmegatron.convert.mapping import hf_groups
from mtmegatron.convert.model import build_model, checkpoint_common, init_single_rank, load_model, parse_flags
from mtmegatron.convert.recorded_flags import flags_from_fingerprint
from mtmegatron.training.checkpoint.megatron_lm_checkpoint import recorded_fingerprint
args = parse_flags(flags_from_fingerprint(recorded_fingerprint(checkpoint_common(sys.argv[1]))))
init_single_rank(args)
model = build_model(args)
load_model(model, sys.argv[1])
state = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
torch.save({name: tensor.contiguous() for names, to_hf in hf_groups(args.model, args)
            for name, tensor in to_hf(*(state[n] for n in names)).items()}, sys.argv[2])
"""


def test_hf_converter_reads_fsdp_checkpoints(runs):
    """FSDP2's and Megatron-FSDP's checkpoints (per-rank row blocks) export exactly what megatron-core's own load
    of them gives, and the weights of DDP's checkpoint of the same iteration up to rounding."""
    from mtmegatron.convert.hf_io import HFCheckpoint

    exported = {}
    for engine in ("fsdp2", "megatron_fsdp", "ddp"):
        out = runs.root / f"hf_{engine}"
        run_cli("convert", "mcore-to-hf", "--load", str(runs.checkpoint(engine)), "--out", str(out))
        exported[engine] = HFCheckpoint(str(out), dtype=None)
    ddp = exported["ddp"]
    for engine in ("fsdp2", "megatron_fsdp"):
        target = runs.root / f"reference_{engine}.pt"
        proc = subprocess.run([sys.executable, "-c", _REFERENCE_EXPORT, str(runs.checkpoint(engine)), str(target)],
                              capture_output=True, text=True, env=ENV, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        reference, ours = torch.load(target), exported[engine]
        assert sorted(reference) == ours.names == ddp.names
        assert all(torch.equal(reference[n], ours[n]) for n in ours.names), engine
        diff = max((ours[n] - ddp[n]).abs().max().item() for n in ours.names)
        assert diff <= 1e-5, f"HF weights from {engine}'s and DDP's checkpoints of iteration {SAVED_AT}: max diff {diff:.3g}"


MFSDP = ["--use-megatron-fsdp", "--use-distributed-optimizer"]


@pytest.mark.parametrize("extra, says", [
    (MFSDP + ["--num-experts", "4", "--save", "ckpt"], "--use-megatron-fsdp with --save/--load: with --num-experts or "
                                                       "--num-distributed-optimizer-instances > 1 (HSDP)"),
    (MFSDP + ["--ckpt-format", "fsdp_dtensor", "--save", "ckpt"], "--ckpt-format fsdp_dtensor: Megatron FSDP's "
                                                                  "DTensor format is not written or read here"),
    (MFSDP + ["--tensor-model-parallel-size", "2", "--load", "ckpt"],
     "--use-megatron-fsdp with --save/--load: with --tensor-model-parallel-size (or --expert-tensor-parallel-size) > 1"),
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
