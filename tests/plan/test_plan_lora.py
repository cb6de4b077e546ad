"""LoRA adapters in ``mtmegatron plan``'s count (plan/params.py wraps the meta model with lora/wrap.py when --lora-r
is given): the planner's parameters equal a real wrapped model's (built on the host as training builds it, the
adapters attached by lora.wrap), at TP 1 and TP 2 + SP alike; the frozen base keeps its weights but gets no
gradients and no optimizer state; the adapters' own activations (A's output, parts x r per token and target: B's
input) are what the real wrapped model's adapters produce. In-process, tiny model (~2 s)."""

from __future__ import annotations

import copy

from helpers.pretrain_runner import TINY

from mtmegatron.plan.command import plan

BASE = [a for a in TINY if a not in ("--backend", "cpu")] + ["--train-iters", "1", "--transformer-impl", "local"]
LORA = ["--lora-r", "8", "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


def _real_wrapped_counts(argv) -> tuple[int, int, int]:
    """(all, trainable) parameters of the model built on the host and wrapped as training/setup.py does, and the
    elements per token its adapters' A matmuls output (summed over the layers)."""
    from mtmegatron import lora
    from mtmegatron.config import parse
    from mtmegatron.lora.adapter import LoRA
    from mtmegatron.lora.section import Lora
    from mtmegatron.models.gpt import build_model_chunks, transformer_config
    from mtmegatron.plan.params import cpu_backend_unless_active
    from mtmegatron.plan.rank_state import Layout, rank_position

    args = copy.copy(parse(argv, world_size=1).args)
    args.use_cpu_initialization = True
    with cpu_backend_unless_active(), rank_position(Layout.of(args), 0):
        config = transformer_config(args)
        config.perform_initialization = False  # real storage; the values do not matter to a count
        chunks = lora.wrap(build_model_chunks(args, config), Lora.of(args), args.seed)
        params = [p for chunk in chunks for p in chunk.parameters()]
        assert all(p.device.type == "cpu" for p in params)
        outputs = sum(m.lora_a.shape[0] for chunk in chunks for m in chunk.modules() if isinstance(m, LoRA))
        return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad), outputs


def test_lora_count_equals_a_real_wrapped_model(tmp_path):
    argv = [*BASE, *LORA, "--log-dir", str(tmp_path)]
    total, trainable, a_outputs = _real_wrapped_counts(argv)
    plain = plan(["--world-size", "1", *BASE, "--log-dir", str(tmp_path)])
    one = plan(["--world-size", "1", *argv])
    two = plan(["--world-size", "2", *argv, "--tensor-model-parallel-size", "2", "--sequence-parallel"])
    assert one["params_total"] == two["params_total"] == total > plain["params_total"]
    row = one["ranks"][0]
    assert 0 < trainable < total // 4
    assert row["weights_bytes"] == 4 * total  # fp32 run: every weight, frozen or not
    assert row["gradients_bytes"] == 4 * trainable  # only the adapters have gradients ...
    assert row["optimizer_bytes"] == 8 * trainable  # ... and Adam's two fp32 moments
    # A's output kept for B, every token of the micro-batch (fp32, one in flight, no dropout, no SP gather)
    assert row["activations_bytes"] - plain["ranks"][0]["activations_bytes"] == 32 * 2 * a_outputs * 4 > 0
