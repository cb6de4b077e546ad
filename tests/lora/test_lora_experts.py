"""LoRA on MoE experts (tiny Mixtral, every layer MoE, 4 experts, top-2), one shared set of four runs (module
fixture): a base checkpoint (one iteration of full training, fp32); LoRA (rank 8) on all four targets, the
experts' linear_fc1/linear_fc2 included, over it on one rank with megatron-core's SequentialMLP for 12 iterations,
saving at 8, whose loss falls; the same at EP2 with grouped-GEMM experts (lora/grouped.py: stacked per-expert
adapters through the grouped matmul), whose losses equal the one-rank run's within 1e-5 (measured: every printed
digit); the one-rank run's iteration-8 adapters resumed at EP2 with grouped experts give iterations 9-12 within 1e-5:
another EP size (one optimizer saved, a dense and an expert one loading: the fully reshardable state regroups) and
the other experts implementation at once. All runs use the distributed optimizer (a plain optimizer's state does
not regroup across EP: training/checkpoint/checkpointing.py refuses it in one line). Both start-up lines count the
same adapters over the whole model (experts summed over EP). ``--peft-out`` of expert adapters is one line and
exit status 2 (lora_peft.EXPERTS_REFUSAL: transformers 5 fuses a MoE layer's experts into 3-D parameters)."""

from __future__ import annotations

import sys

import pytest

from helpers.cli_subprocess import ENV
from helpers.pretrain_runner import run_job, run_pretrain

ITERS, RESUME_AT = 12, 8
MIXTRAL = ["--backend", "cpu", "--model", "mixtral", "--num-layers", "2", "--hidden-size", "64",
           "--num-attention-heads", "4", "--num-query-groups", "2", "--ffn-hidden-size", "128", "--num-experts", "4",
           "--moe-router-topk", "2", "--seq-length", "32", "--max-position-embeddings", "32", "--vocab-size", "256",
           "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "5e-3", "--lr-decay-style", "constant",
           "--mock-data", "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "1",
           "--num-workers", "0", "--transformer-impl", "local", "--use-distributed-optimizer"]


def _losses(rows) -> list[float]:
    return [r["loss"] for r in rows if "loss" in r]


def _startup(proc) -> list[str]:
    return [ln for ln in proc.stdout.splitlines() if ln.startswith("mtmegatron: LoRA r")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora_experts")
    base, adapters = tmp / "base", tmp / "adapters"
    run_pretrain(1, MIXTRAL + ["--train-iters", "1", "--save", str(base)], tmp / "log_base")
    lora = ["--load", str(base), "--lora-r", "8", "--lora-alpha", "16", "--train-iters", str(ITERS)]
    one, rows = run_pretrain(1, MIXTRAL + lora + ["--save", str(adapters), "--save-interval", str(RESUME_AT)],
                             tmp / "log_one")
    one_losses = _losses(rows)
    ep2 = ["--expert-model-parallel-size", "2", "--moe-grouped-gemm"]
    grouped, rows = run_pretrain(2, MIXTRAL + lora + ep2, tmp / "log_ep2")
    ep2_losses = _losses(rows)
    (adapters / "latest_checkpointed_iteration.txt").write_text(str(RESUME_AT))
    _, rows = run_pretrain(2, MIXTRAL + lora + ep2 + ["--lora-load", str(adapters)], tmp / "log_resumed")
    peft = run_job([sys.executable, "-m", "mtmegatron.cli", "convert", "mcore-to-hf", "--load", str(base),
                    "--lora-load", str(adapters), "--peft-out", str(tmp / "peft")], ENV, timeout=300,
                   what="mtmegatron convert mcore-to-hf --peft-out")
    return one_losses, ep2_losses, _losses(rows), [_startup(one), _startup(grouped)], peft


def test_the_loss_falls(runs):
    one = runs[0]
    assert len(one) == ITERS
    assert sum(one[-4:]) / 4 < sum(one[:4]) / 4 - 0.05, one  # measured: 5.10 -> 4.99


def test_ep2_grouped_experts_equal_one_rank_sequential(runs):
    one, ep2 = runs[:2]
    assert len(ep2) == ITERS
    assert max(abs(a - b) for a, b in zip(one, ep2)) < 1e-5, (one, ep2)


def test_one_rank_sequential_adapters_resume_at_ep2_grouped(runs):
    one, resumed = runs[0], runs[2]
    assert len(resumed) == ITERS - RESUME_AT
    assert max(abs(a - b) for a, b in zip(resumed, one[RESUME_AT:])) < 1e-5, (one, resumed)


def test_startup_line_counts_every_expert_adapter(runs):
    # per layer, hidden 64, 4 heads in 2 query groups (q/k/v rows 128), 4 experts of ffn 128 (SwiGLU fc1 rows 256):
    # qkv 3*8*64 + 128*8, proj 8*64 + 64*8, each expert fc1 2*8*64 + 256*8 and fc2 8*128 + 64*8 = 22,016; 2 layers
    for lines in runs[3]:
        assert len(lines) == 1 and lines[0].startswith(
            "mtmegatron: LoRA r 8 alpha 16 on linear_qkv, linear_proj, linear_fc1, linear_fc2 | trainable 44,032 of "
            "298,816 parameters"), lines


def test_peft_export_of_expert_adapters_is_refused(runs):
    proc = runs[4]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(lines) == 1 and "--peft-out: MoE expert adapters have no HF PEFT form here" in lines[0], lines
