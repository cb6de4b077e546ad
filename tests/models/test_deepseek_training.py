"""DeepSeek-V3 from an HF checkpoint: convert, train, and the same loss curve under every parallel layout.

A tiny random ``DeepseekV3ForCausalLM`` (4 layers: 1 dense + 3 MoE, shared expert, group-limited sigmoid router
with correction bias, MLA with q LoRA, YaRN) plus an MTP layer in DeepSeek's release layout is converted with
``mtmegatron convert hf-to-mcore --tensor-model-parallel-size 2``. Then ``torchrun -m mtmegatron.pretrain
--load <converted>`` (fp32, dropout 0, MTP on, the aux-loss-free expert bias updated every step):
* acceptance: the first iteration's logged loss (the LM loss before any update) equals HF's loss on the same
  global batch, reduced the same way (masked token mean per micro-batch, mean over micro-batches; the mock
  data masks label 0), within 1e-4 (measured ~1e-7);
* the single-rank run learns (loss falls over 4 iterations) and logs ``mtp_loss`` and ``moe_aux_loss``;
* TP2 (+SP), EP2, and PP2 x EP2 (MTP on the last stage) give the single-rank per-iteration losses within 1e-4
  relative (measured <= ~1e-7: reduction order only).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import torch

from helpers.hf_parity import HF_MODELS
from helpers.pretrain_runner import run_pretrain

ITERS = 4
TRAIN = ["--backend", "cpu", "--mock-data", "--seq-length", "16", "--micro-batch-size", "2",
         "--global-batch-size", "8", "--train-iters", str(ITERS), "--lr", "3e-3", "--lr-decay-style", "constant",
         "--log-interval", "100"]
LOSS_ATOL = 1e-4
RTOL = 1e-4
# Under sequence parallelism megatron-core computes the sequence-level aux loss over each TP rank's share of
# the sequence (a different objective), so that layout and its own single-rank reference run without it.
NO_AUX = ["--moe-aux-loss-coeff", "0"]
# TP layouts exercise patches/mla_tp_rope_key_grad.py: without it megatron-core's local-spec MLA drops the other
# TP ranks' share of the shared RoPE key's gradient (3.7e-4 relative by iteration 3, first iteration equal).
LAYOUTS = {
    "tp2_sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"] + NO_AUX),
    "ep2": (2, ["--expert-model-parallel-size", "2"]),
    "pp2_ep2_mtp": (4, ["--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2"]),
}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def _run(command: list[str]) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


def _first_global_batch(flags: list[str]) -> dict:
    """Global batch 0 as pretrain reads it (training/data.py: samples [0, G) of megatron's mock dataset)."""
    from mtmegatron.convert.model import parse_flags
    from mtmegatron.data.section import GptData
    from mtmegatron.training.data import build_mock_dataset

    args = parse_flags(flags)
    dataset = build_mock_dataset(GptData.of(args), (args.train_iters + 1) * args.global_batch_size)
    samples = [dataset[i] for i in range(args.global_batch_size)]
    return {key: torch.stack([torch.as_tensor(s[key]) for s in samples]) for key in ("tokens", "labels", "loss_mask")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepseek")
    hf_dir, mc_dir = root / "hf", root / "mcore"
    _run([sys.executable, str(HF_MODELS), "deepseek-v3", str(hf_dir)])
    _run([sys.executable, "-m", "mtmegatron.cli", "convert", "hf-to-mcore", "--model", "deepseek-v3",
          "--hf-dir", str(hf_dir), "--out", str(mc_dir), "--tensor-model-parallel-size", "2"])
    flags = shlex.split((mc_dir / "model_flags.txt").read_text()) + TRAIN + ["--load", str(mc_dir)]
    assert flags[flags.index("--mtp-num-layers") + 1] == "1"
    batch_file = root / "batch.pt"
    torch.save(_first_global_batch(flags), batch_file)
    _run([sys.executable, str(HF_MODELS), "--loss", str(hf_dir), str(batch_file), TRAIN[TRAIN.index("--micro-batch-size") + 1]])
    hf_loss = torch.load(batch_file)["hf_loss"]
    _, rows = run_pretrain(1, flags, root / "single")
    return root, flags, hf_loss, rows


def test_converted_checkpoint_continues_from_hf_weights(reference):
    _, _, hf_loss, rows = reference
    losses = [r["loss"] for r in rows]
    assert len(losses) == ITERS
    print(f"\nfirst-iteration loss {losses[0]:.7f} vs HF {hf_loss:.7f}: |diff| {abs(losses[0] - hf_loss):.2e}")
    assert abs(losses[0] - hf_loss) <= LOSS_ATOL, (losses[0], hf_loss)
    assert losses[-1] < losses[0] - 0.05, f"did not learn: {losses}"
    assert all("mtp_loss" in r and "moe_aux_loss" in r for r in rows), rows[0]
    assert all(r["mtp_loss"] > 0 and r["moe_aux_loss"] > 0 for r in rows)


@pytest.fixture(scope="module")
def reference_no_aux(reference):
    root, flags, _, _ = reference
    _, rows = run_pretrain(1, flags + NO_AUX, root / "single_no_aux")
    return rows


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_rank(request, reference, layout):
    root, flags, _, rows = reference
    nproc, extra = LAYOUTS[layout]
    if NO_AUX[0] in extra:
        rows = request.getfixturevalue("reference_no_aux")
    _, layout_rows = run_pretrain(nproc, flags + extra, root / layout)
    ref, got = [r["loss"] for r in rows], [r["loss"] for r in layout_rows]
    assert len(got) == len(ref), f"{layout}: {len(got)} iterations logged"
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref, got))
    print(f"\n{layout}: max relative loss difference vs single rank {worst:.2e}")
    assert worst <= RTOL, f"{layout}: {worst:.2e} > {RTOL}\n{ref}\n{got}"
    assert all("mtp_loss" in r for r in layout_rows)


def test_tp2_needs_the_mla_rope_key_patch(request, reference):
    """Without patches/mla_tp_rope_key_grad.py the TP2+SP run leaves the single-rank curve (the bug it fixes)."""
    root, flags, _, _ = reference
    rows = request.getfixturevalue("reference_no_aux")
    nproc, extra = LAYOUTS["tp2_sp"]
    env = {"MTMEGATRON_DISABLE_PATCHES": "mla_tp_rope_key_grad"}
    _, layout_rows = run_pretrain(nproc, flags + extra, root / "tp2_sp_unpatched", env=env)
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(rows, layout_rows))
    print(f"\ntp2_sp without the patch: max relative loss difference {worst:.2e}")
    assert len(layout_rows) == len(rows) and worst > RTOL
