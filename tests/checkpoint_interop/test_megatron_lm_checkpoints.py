"""Megatron-LM checkpoints load here, and ours load in Megatron-LM (tests/fixtures/megatron_lm_ckpt).

The fixture is a real checkpoint written by Megatron-LM core_v0.16.1's ``pretrain_gpt.py`` (TP1 x DP2,
distributed optimizer, saved at iteration 3; scripts/make_megatron_lm_fixture.py), with the losses Megatron-LM
logged when its own loader resumed it (iterations 4 and 5). Both sides read mock data in the same order:
megatron-core's MockGPTDataset is deterministic given the seed and sequence length (a mock config always uses
the split 1,1,1, and one epoch, so the order does not depend on the number of samples asked for), and global
batch i is samples [i*G, (i+1)*G) on both (Megatron-LM's sampler hands DP rank d the d-th micro-batch of each
slice of micro-batch x DP samples; ours the d-th contiguous slice: the same set per global batch, the same
micro-batches when there is one micro-batch per rank as here). NullTokenizer --vocab-size 127 is 128 ids with
end-of-document 127 = our mock tokenizer of --vocab-size 128.

- Resuming under other layouts (TP2, PP2; the fixture is DP2) gives Megatron-LM's losses within 1e-5.
- ``--finetune`` loads exactly the fixture's weights and nothing else (iteration 0, fresh optimizer).
- The PP2 run saves at iteration 4; that checkpoint, read the way Megatron-LM's ``load_checkpoint`` reads it
  (tests/checkpoint_interop/worker.py) at TP1 PP1, takes its step 5 to Megatron-LM's own loss at 5.
The same round trip through Megatron-LM's real trainer is ``scripts/make_megatron_lm_fixture.py --reader``.

Three more fixtures of the same script (``--config``; each with Megatron-LM's losses after its own resume and
after its own ``--finetune``): Megatron-LM's GPT defaults (LayerNorm, GeLU, learned positions, biases, tied
embeddings) at sequence length 64, an MoE written with EP2 and the distributed optimizer (a dense and an
expert optimizer), a dense model written under PP2 with a warm-up + cosine schedule. Each resumes under another
layout with Megatron-LM's next two losses and learning rates, and fine-tunes with its first two losses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.child_path import with_tests_on_path
from helpers.megatron_lm_fixture import FIXTURE_FLAGS, TRAINING_FLAGS
from helpers.pretrain_runner import run_pretrain

HERE = Path(__file__).parent
FIXTURE = HERE.parent / "fixtures" / "megatron_lm_ckpt"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())

TOLERANCE = 1e-5  # fp32, the same data; the losses differ only by reduction order


def megatron_lm_loss(iteration: int) -> float:
    return EXPECTED["losses_after_resume"][str(iteration)]["lm_loss"]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """Our runs resuming the fixture under TP2 (saving weights only at 5) and PP2 (saving at 4 and 5)."""
    tmp = tmp_path_factory.mktemp("resume")
    runs = {}
    for name, layout in (("tp2", ["--tensor-model-parallel-size", "2", "--save", str(tmp / "weights_only"),
                                  "--no-save-optim", "--no-save-rng"]),
                         ("pp2", ["--pipeline-model-parallel-size", "2", "--save", str(tmp / "ours"),
                                  "--save-interval", "4"])):
        proc, rows = run_pretrain(2, FIXTURE_FLAGS + layout + ["--load", str(FIXTURE)], tmp / name, timeout=600)
        runs[name] = (proc, rows)
    return tmp, runs


def _worker(*argv) -> dict:
    env = with_tests_on_path({**os.environ, "OMP_NUM_THREADS": "1"})
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(HERE / "worker.py"), *map(str, argv)], capture_output=True, text=True,
                          timeout=300, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_megatron_lm_checkpoint_resumes_with_its_losses_under_another_layout(resumed, layout):
    _, runs = resumed
    proc, rows = runs[layout]
    assert "loaded Megatron-LM checkpoint" in proc.stdout and "continuing at iteration 3" in proc.stdout
    assert [r["iteration"] for r in rows] == [4, 5]
    for row in rows:
        assert abs(row["loss"] - megatron_lm_loss(row["iteration"])) < TOLERANCE, (row, EXPECTED["losses_after_resume"])
    # the schedule continued from Megatron-LM's (its lr at iteration 5 is the one it logged after step 4)
    assert rows[1]["lr"] == pytest.approx(EXPECTED["losses_after_resume"]["4"]["lr"], rel=1e-12)


def test_finetune_takes_exactly_the_megatron_lm_weights_and_nothing_else():
    result = _worker("finetune", FIXTURE)
    assert result["iteration"] == 0 and result["scheduler_steps"] == 0
    assert result["weights"] >= 10 and result["max_weight_difference"] == 0.0
    assert result["optimizer_state_entries"] == 0  # fresh optimizer: nothing loaded into it


def test_our_checkpoint_read_as_megatron_lm_reads_it_continues_megatron_lm_losses(resumed):
    tmp, _ = resumed
    result = _worker("megatron-lm-reader", tmp / "ours", 4)
    assert result["tracked"] == 5 and result["ckpt_tp_pp"] == [1, 2] and result["world_size"] == 2
    assert not result["rng_loaded"]  # TP/PP differ (PP2 -> PP1): Megatron-LM ignores RNG states then
    assert result["scheduler_steps"] == 5 * 4  # the step taken after loading 4 x global batch 4
    assert abs(result["loss"] - megatron_lm_loss(5)) < TOLERANCE, result


def test_no_save_optim_and_no_save_rng_leave_them_out_as_megatron_lm_does(resumed):
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    tmp, _ = resumed
    directory = tmp / "weights_only" / "iter_0000005"
    common = torch.load(directory / "common.pt", weights_only=False)
    assert common["args"].no_save_optim and common["args"].no_save_rng  # Megatron-LM's loader reads these
    assert "opt_param_scheduler" not in common and common["checkpoint_version"] == 3.0
    keys = FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    assert any(k.startswith("decoder.layers.") for k in keys)
    assert not [k for k in keys if k.startswith(("optimizer.", "rng_state"))]


# Megatron-LM's configurations (scripts/make_megatron_lm_fixture.py --config NAME): our flags for its model, and
# the layout we resume it under (it was written under another one)
CONFIGS = {
    "gpt-defaults": (["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "64",
                      "--max-position-embeddings", "64", "--lr-warmup-iters", "1"],
                     ["--tensor-model-parallel-size", "2"]),  # written TP1 DP2
    "moe-ep2-distopt": (["--num-layers", "2", "--hidden-size", "32", "--ffn-hidden-size", "32",
                         "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
                         "--seq-length", "32", "--max-position-embeddings", "32", "--position-embedding-type", "rope",
                         "--normalization", "RMSNorm", "--swiglu", "--untie-embeddings-and-output-weights",
                         "--disable-bias-linear", "--num-experts", "4", "--moe-router-topk", "2",
                         "--moe-token-dispatcher-type", "alltoall", "--lr-warmup-iters", "1"],
                        ["--save", "{tmp}/moe-ours", "--save-interval", "4"]),  # written EP2 DP2 (dense + expert
    # optimizers): resumed EP1 DP2 (one optimizer), saving at 4 for test_our_ep1_checkpoint_resumes_under_ep2
    "dense-pp2-cosine": (["--num-layers", "2", "--hidden-size", "32", "--ffn-hidden-size", "64",
                          "--num-attention-heads", "4", "--seq-length", "48", "--max-position-embeddings", "48",
                          "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                          "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--lr-warmup-iters", "2"],
                         []),  # written PP2 DP1: resumed PP1 DP2
}


def config_fixture(name: str) -> Path:
    return HERE.parent / "fixtures" / f"megatron_lm_{name.replace('-', '_')}"


@pytest.fixture(scope="module")
def megatron_lm_runs(tmp_path_factory):
    """Per configuration, run once: our resume under another layout (2 ranks) and our ``--finetune`` (1 rank)."""
    tmp = tmp_path_factory.mktemp("configs")
    cache = {}

    def runs(name: str):
        if name not in cache:
            model, layout = CONFIGS[name]
            flags = TRAINING_FLAGS + model + ["--load", str(config_fixture(name))]
            layout = [flag.format(tmp=tmp) for flag in layout]
            resumed = run_pretrain(2, flags + layout, tmp / f"{name}-resume", timeout=600)
            finetuned = run_pretrain(1, flags + ["--finetune", "--exit-interval", "2"], tmp / f"{name}-finetune",
                                     timeout=600)
            cache[name] = resumed, finetuned
        return cache[name]

    runs.tmp = tmp
    return runs


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_megatron_lm_run_continues_under_another_layout_and_finetunes_with_its_losses(megatron_lm_runs, name):
    expected = json.loads((config_fixture(name) / "expected.json").read_text())
    assert expected["config"] == name
    (proc, rows), (_, finetune_rows) = megatron_lm_runs(name)
    assert "loaded Megatron-LM checkpoint" in proc.stdout and "continuing at iteration 3" in proc.stdout
    logged = {**expected["losses_before_save"], **expected["losses_after_resume"]}
    assert [r["iteration"] for r in rows] == [4, 5]
    for row in rows:
        megatron_lm = logged[str(row["iteration"])]
        assert abs(row["loss"] - megatron_lm["lm_loss"]) < TOLERANCE, (name, row, megatron_lm)
        # Megatron-LM logs the learning rate after the step's scheduler update: the one iteration i+1 uses
        assert row["lr"] == pytest.approx(logged[str(row["iteration"] - 1)]["lr"], rel=1e-9, abs=1e-12), (name, row)
    assert [r["iteration"] for r in finetune_rows] == [1, 2]
    for row in finetune_rows:
        megatron_lm = expected["losses_finetune"][str(row["iteration"])]["lm_loss"]
        assert abs(row["loss"] - megatron_lm) < TOLERANCE, (name, "finetune", row, megatron_lm)
    assert finetune_rows[1]["lr"] == pytest.approx(expected["losses_finetune"]["1"]["lr"], rel=1e-9)


def test_our_ep1_checkpoint_resumes_under_ep2_with_megatron_lm_losses(megatron_lm_runs):
    """The other direction: our EP1 save (one optimizer) at iteration 4 of the MoE fixture's run, resumed under
    EP2 (a dense and an expert optimizer), takes step 5 to Megatron-LM's loss."""
    import shutil

    megatron_lm_runs("moe-ep2-distopt")
    tmp = megatron_lm_runs.tmp
    ours = tmp / "moe-ours-at-4"
    shutil.copytree(tmp / "moe-ours" / "iter_0000004", ours / "iter_0000004")
    (ours / "latest_checkpointed_iteration.txt").write_text("4")
    model, _ = CONFIGS["moe-ep2-distopt"]
    proc, rows = run_pretrain(2, TRAINING_FLAGS + model + ["--expert-model-parallel-size", "2", "--load", str(ours)],
                              tmp / "moe-ep2-resume", timeout=600)
    assert "continuing at iteration 4" in proc.stdout and "RNG states not restored" in proc.stdout
    expected = json.loads((config_fixture("moe-ep2-distopt") / "expected.json").read_text())
    assert [r["iteration"] for r in rows] == [5]
    assert abs(rows[0]["loss"] - expected["losses_after_resume"]["5"]["lm_loss"]) < TOLERANCE, rows


def test_optimizer_count_change_outside_the_fully_reshardable_format_is_refused_in_one_line():
    """Megatron-LM's default 'dp_reshardable' state is laid out per optimizer: an EP>1 checkpoint (dense + expert
    optimizers) into an EP1 run (one) is refused naming the layout to use; the fully reshardable one regroups."""
    from types import SimpleNamespace

    from mtmegatron.training.checkpoint import checkpointing
    from mtmegatron.utils import checkpoint_dirs

    common = {"optimizer": {0: {"optimizer": {"param_groups": []}}, 1: {"optimizer": {"param_groups": []}}}}
    one = SimpleNamespace(chained_optimizers=[object()])
    with pytest.raises(checkpoint_dirs.CheckpointError, match=r"holds 2 optimizers \('dp_reshardable' state.*this run "
                                                            r"1: run with the checkpoint's --expert-model-parallel"):
        checkpointing._check_optimizer_count(common, one, "dp_reshardable", "ckpt/iter_0000003")
    checkpointing._check_optimizer_count(common, one, "fully_reshardable", "ckpt/iter_0000003")
    checkpointing._check_optimizer_count(common, SimpleNamespace(chained_optimizers=[1, 2]), "dp_reshardable", "d")
    # an fp32 run's plain optimizer (torch's state + param_groups) is one optimizer too: EP1 -> EP2 refused
    with pytest.raises(checkpoint_dirs.CheckpointError, match=r"holds 1 optimizers \(non-distributed"):
        checkpointing._check_optimizer_count({"optimizer": {"state": {}, "param_groups": []}},
                                             SimpleNamespace(chained_optimizers=[1, 2]), None, "d")
