"""The pipeline-split advice for the native-resolution vision-language models (models/families/qwen2_vl/stage_balance.py).

The estimate's matmul FLOPs equal what torch's FlopCounterMode counts in the real tiny towers' forward (vision tower
on one 16x16-patch image = the 64-token budget; one language layer on 64 tokens) exactly; the attention scores, which
run in a custom op the counter does not see, are the textbook 4*n*attended*heads*head_dim (checked apart). The
advised split minimises the costliest stage and the start-up line names the split in use.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from mtmegatron.models.families.qwen2_vl import stage_balance as balance

COUNT = r"""
import json, sys, torch
from torch.utils.flop_counter import FlopCounterMode
from mtmegatron.convert.model import build_model, init_single_rank, parse_flags
from mtmegatron.models.families.qwen2_vl import stage_balance as balance
args = parse_flags(["--model", sys.argv[1], "--model-size", "tiny", "--micro-batch-size", "1", "--global-batch-size",
                    "1", "--seq-length", "64", "--max-position-embeddings", "64"])
init_single_rank(args)
model = build_model(args).eval()
side = 16  # 16x16 patches, merged 2x2: the 64 tokens of the budget
pixels = torch.randn(side * side, 3 * args.vision_temporal_patch_size * args.patch_dim ** 2)
with FlopCounterMode(display=False) as vision:
    model.vision_model(pixels, torch.tensor([[1, side, side]]))
with FlopCounterMode(display=False) as layer:
    model.language_model.decoder.layers[0](torch.randn(64, 1, args.hidden_size), attention_mask=None)
json.dump({"vision": vision.get_total_flops(), "vision_estimate": balance.vision_tower_flops(args, attention=False),
           "layer": layer.get_total_flops(), "layer_estimate": balance.language_layer_flops(args, attention=False)},
          sys.stdout)
"""


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen2.5-vl"])
def test_the_estimate_counts_the_towers_matmuls(family):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-c", COUNT, family], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counted = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counted["vision"] == counted["vision_estimate"] > 0, counted
    assert counted["layer"] == counted["layer_estimate"] > 0, counted


def _released_7b(**over) -> argparse.Namespace:
    """Qwen2.5-VL-7B's shapes (HF config.json), 4096 tokens."""
    fields = dict(seq_length=4096, micro_batch_size=1, hidden_size=3584, ffn_hidden_size=18944, num_attention_heads=28,
                  num_query_groups=4, kv_channels=128, swiglu=True, num_layers=28, vision_spatial_merge_size=2,
                  vision_hidden_size=1280, vision_num_attention_heads=16, vision_window_size=112, patch_dim=14,
                  vision_full_attention_layers=[7, 15, 23, 31], vision_num_layers=32, vision_ffn_hidden_size=3420,
                  vision_swiglu=True, vision_temporal_patch_size=2, pipeline_model_parallel_size=4,
                  decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
                  virtual_pipeline_model_parallel_size=None, num_layers_per_virtual_pipeline_stage=None)
    return argparse.Namespace(**{**fields, **over})


def test_attention_terms():
    args = _released_7b(seq_length=8, micro_batch_size=1)
    s, heads, d = 8, 28, 128
    assert balance.language_layer_flops(args) - balance.language_layer_flops(args, attention=False) \
        == 4.0 * s * (s + 1) / 2 * heads * d  # causal: token i attends to i + 1 keys, (s + 1) / 2 on average
    windowless = _released_7b(seq_length=8, vision_window_size=None)
    patches = 8 * 4  # the budget: 8 tokens of one image, 2x2 patches each
    assert balance.vision_tower_flops(windowless) - balance.vision_tower_flops(windowless, attention=False) \
        == 32 * 4.0 * patches * patches * 1280  # every layer attends over the whole image


def test_the_advised_split_minimises_the_costliest_stage():
    args = _released_7b()
    split = balance.stage_split(args)
    assert split.vision_in_layers > 1  # a 4096-token image on the first stage outweighs a language layer
    assert split.used_costs[0] == pytest.approx(split.vision_in_layers + 7)  # even split: 7 layers each
    for first in (1, 4, 7, 10, 13):  # every first-stage count that leaves the rest even over 3 stages
        costs = balance.stage_split(_released_7b(decoder_first_pipeline_num_layers=first)).used_costs
        assert max(split.balanced_costs) <= max(costs)
    assert split.balanced_first < 7  # the first stage gives language layers away
    line = balance.describe(args)
    assert "Megatron-LM's even split" in line and f"--decoder-first-pipeline-num-layers {split.balanced_first} would" \
        in line
    chosen = balance.describe(_released_7b(decoder_first_pipeline_num_layers=split.balanced_first))
    assert chosen.endswith("the balanced one")
    assert balance.describe(_released_7b(pipeline_model_parallel_size=1)) is None
    virtual = balance.describe(_released_7b(num_layers_per_virtual_pipeline_stage=1))
    assert "first virtual chunk" in virtual and "would balance" not in virtual  # no split advice it would refuse


def test_a_pipelined_run_says_it_at_start_up():
    from mtmegatron.convert.model import parse_flags
    from mtmegatron.config import run_plan

    flags = ["--model", "qwen2.5-vl", "--model-size", "tiny", "--pipeline-model-parallel-size", "2",
             "--micro-batch-size", "1", "--global-batch-size", "2"]
    lines = run_plan.startup_lines(parse_flags(flags, world_size=2))
    assert [line for line in lines if line.startswith("mtmegatron: pipeline stages (forward FLOPs")], lines
    assert not [line for line in run_plan.startup_lines(parse_flags(flags[:4] + flags[6:])) if "pipeline" in line]
