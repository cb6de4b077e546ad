"""Invalid combinations of the memory/overlap flags: each is one message, exit status 2, before any process group.

Every rule is checked through the parser itself (in-process: the message); two cases go through the real
command (exit status 2, one error line, nothing started).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.pretrain_runner import TINY
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

BANNER = "mtmegatron: backend"  # printed only after process groups and the model exist
BASE = TINY + ["--train-iters", "1"]
DISTOPT = ["--use-distributed-optimizer"]
FULL = ["--recompute-granularity", "full"]

CASES = {
    "param_gather_without_distopt": (["--overlap-grad-reduce", "--overlap-param-gather"],
                                     "--overlap-param-gather needs --use-distributed-optimizer"),
    "param_gather_without_grad_reduce": (DISTOPT + ["--overlap-param-gather"],
                                         "--overlap-param-gather needs --overlap-grad-reduce"),
    "bucket_size_without_overlap": (["--ddp-bucket-size", "1000"], "--ddp-bucket-size needs --overlap-grad-reduce"),
    "bucket_size_not_positive": (["--overlap-grad-reduce", "--ddp-bucket-size", "0"],
                                 "--ddp-bucket-size must be a positive number of elements, not 0"),
    "precision_aware_without_distopt": (["--use-precision-aware-optimizer"],
                                        "--use-precision-aware-optimizer needs --use-distributed-optimizer"),
    "offload_without_precision_aware": (DISTOPT + ["--optimizer-cpu-offload"],
                                        "--optimizer-cpu-offload needs --use-precision-aware-optimizer"),
    "offload_side_flags_without_offload": (["--overlap-cpu-optimizer-d2h-h2d"],
                                           "need --optimizer-cpu-offload"),
    "offload_fraction_range": (["--optimizer-offload-fraction", "1.5"],
                               "--optimizer-offload-fraction must be between 0 and 1, not 1.5"),
    "selective_with_method": (["--recompute-granularity", "selective", "--recompute-method", "block"],
                              "--recompute-granularity selective takes --recompute-modules"),
    "mla_up_proj_without_mla": (["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"],
                                "--recompute-modules mla_up_proj needs --multi-latent-attention"),
    "moe_act": (["--recompute-granularity", "selective", "--recompute-modules", "moe_act"],
                "--recompute-modules moe_act needs megatron-core's grouped GEMM experts"),
    "full_without_method": (FULL, "--recompute-granularity full needs --recompute-method uniform|block and "
                                  "--recompute-num-layers"),
    # megatron-core's uniform loop never ends on 0 and indexes past the chunk's last layer when N does not divide it
    "uniform_zero": (FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "0"],
                     "--recompute-method uniform: --recompute-num-layers 0 must divide the 4 layers"),
    "uniform_not_dividing": (FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "3"],
                             "--recompute-method uniform: --recompute-num-layers 3 must divide the 4 layers"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_invalid_memory_flags_are_one_error(case):
    extra, message = CASES[case]
    with pytest.raises(ConfigError) as raised:
        parse_args(BASE + extra)
    assert message in str(raised.value)


@pytest.mark.parametrize("case", ["param_gather_without_grad_reduce", "full_without_method"])
def test_the_command_exits_2_before_process_groups(case):
    extra, message = CASES[case]
    proc = subprocess.run([sys.executable, "-m", "mtmegatron.pretrain", *BASE, *extra], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mtmegatron.pretrain: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert BANNER not in proc.stdout and "Traceback" not in proc.stderr


# accepted as Megatron-LM accepts them: recompute flags the granularity does not read are ignored; block with 0
# layers recomputes none (MT-MegatronLM's launch scripts pass exactly that) and with more than a chunk's layers
# recomputes all of them; moe recompute in a dense model has nothing to recompute
ACCEPTED = {
    "method_without_granularity": ["--recompute-method", "uniform", "--recompute-num-layers", "1"],
    "modules_with_full": FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "1",
                                 "--recompute-modules", "mlp"],
    "moe_without_experts": ["--recompute-granularity", "selective", "--recompute-modules", "moe"],
    "block_zero": FULL + ["--recompute-method", "block", "--recompute-num-layers", "0"],
    "block_more_than_the_layers": FULL + ["--recompute-method", "block", "--recompute-num-layers", "9"],
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_recompute_flags_megatron_lm_accepts(case):
    args = parse_args(BASE + ACCEPTED[case])
    assert args.recompute_num_layers == {"method_without_granularity": 1, "modules_with_full": 1, "block_zero": 0,
                                         "block_more_than_the_layers": 9}.get(case)


@pytest.mark.parametrize("count, recomputed", [(0, []), (2, [0, 1]), (9, [0, 1, 2, 3])])
def test_block_recompute_of_megatron_core_recomputes_the_first_n_layers(count, recomputed, monkeypatch):
    """megatron-core's own block loop (TransformerBlock._checkpointed_forward) on 4 layers: which layers go
    through tensor_parallel.checkpoint for the counts the flags accept."""
    import types

    import torch
    from megatron.core import tensor_parallel
    from megatron.core.transformer.transformer_block import TransformerBlock

    args = parse_args(BASE + FULL + ["--recompute-method", "block", "--recompute-num-layers", str(count)])
    calls, checkpointed = [], []

    def layer_fn(index):
        def forward(hidden_states, **_):
            calls.append(index)
            return hidden_states + 1, None
        return forward

    def checkpoint(function, distribute_saved_activations, *inputs):
        checkpointed.append(len(calls))  # the index of the layer about to run
        return function(*inputs)

    monkeypatch.setattr(tensor_parallel, "checkpoint", checkpoint)
    config = types.SimpleNamespace(recompute_method=args.recompute_method, fp8=None, fp4=None,
                                   recompute_num_layers=args.recompute_num_layers, distribute_saved_activations=False)
    layers = [layer_fn(i) for i in range(4)]
    block = types.SimpleNamespace(config=config, num_layers_per_pipeline_rank=4, _get_layer=layers.__getitem__)
    out = TransformerBlock._checkpointed_forward(block, torch.zeros(1), None, None, None, None, None, None, False)
    assert calls == [0, 1, 2, 3] and out.item() == 4 and checkpointed == recomputed
