"""Activation recompute changes nothing but memory and time: 10 iterations equal the same run without it (first
iteration exactly, then within 1e-5 relative). Dropout is on (0.1 hidden and attention), so a recomputed
forward that drew different dropout masks than the original (RNG tracker states not replayed) changes the
gradients and fails the comparison from iteration 2 on.

Layouts: TP2 + sequence parallel (full/uniform, full/block, selective core_attn+mlp+layernorm), and Mixtral MoE
with EP2 and the alltoall dispatcher (full/uniform, selective moe: the recomputed forward dispatches the tokens
again).
"""

from __future__ import annotations

import pytest

from equivalence import ITERS, assert_same_losses
from helpers.pretrain_runner import TINY, run_pretrain

DROPOUT = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1"]
BASE = TINY + ["--train-iters", str(ITERS), "--num-samples", "0"] + DROPOUT
TP2_SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
MIXTRAL_EP2 = ["--model", "mixtral", "--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0",
               "--moe-token-dispatcher-type", "alltoall", "--expert-model-parallel-size", "2"]
FULL_UNIFORM = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
FULL_BLOCK = ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "3"]
LAYOUTS = {
    "tp2_sp": (TP2_SP, {"full_uniform": FULL_UNIFORM, "full_block": FULL_BLOCK,
                        "selective": ["--recompute-granularity", "selective",
                                      "--recompute-modules", "core_attn", "mlp", "layernorm"]}),
    "mixtral_ep2": (MIXTRAL_EP2, {"full_uniform": FULL_UNIFORM,
                                  "selective_moe": ["--recompute-granularity", "selective",
                                                    "--recompute-modules", "moe", "layernorm"]}),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_recompute_is_loss_equivalent(layout, tmp_path):
    extra, variants = LAYOUTS[layout]
    _, base = run_pretrain(2, BASE + extra, tmp_path / "base")
    for name, flags in variants.items():
        _, rows = run_pretrain(2, BASE + extra + flags, tmp_path / name)
        worst = assert_same_losses(base, rows)
        print(f"{layout} recompute {name}: max relative loss difference {worst:.2e}")
